package shard_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// TestStress churns a group: each round a random member crashes (its store
// closed under it, its rows left to expire) or leaves, and a new one
// joins; after each settle every shard has one owner, loads differ by at
// most one, the shards moved are those the assignment moves, a crashed
// member's shards are taken over within TTL + PollInterval (plus slack
// for the statements and the settle, measured from the crash to the
// settle; each member's Store has a pool apart from its owners' writes),
// and no fenced write of a superseded owner commits. By default 200 shards
// over 4 members for 4 rounds (TTL 2 s, poll 200 ms); PGLOCKS_STRESS=1:
// 1,000 shards over 10 members for 20 rounds (TTL 10 s, poll 1 s), and the
// statements per second of the group at rest (see restRate).
func TestStress(t *testing.T) {
	t.Parallel()
	n, m, rounds := 200, 4, 4
	ttl, poll := 2*time.Second, 200*time.Millisecond
	big := os.Getenv("PGLOCKS_STRESS") != ""
	if big {
		// TTL 10 s: with 2 s, 1,000 owners' fenced writes on 2 cores
		// delayed renewals past their trust deadlines.
		n, m, rounds = 1000, 10, 20
		ttl, poll = 10*time.Second, time.Second
	}
	g := newGroup(t, n, ttl, poll)
	var ids []string
	next := 0
	join := func() {
		id := fmt.Sprintf("m%d", next)
		next++
		g.join(id)
		ids = append(ids, id)
	}
	for range m {
		join()
	}
	start := time.Now()
	prev := g.settle(2 * time.Minute)
	t.Logf("%d shards over %d members settled in %v", n, m, time.Since(start))
	g.balanced(prev)
	if big {
		restRate(t, g)
	}
	mc := newMoveChecker(t, g, prev)
	for r := range rounds {
		victim := ids[rand.N(len(ids))]
		crash := rand.N(2) == 0
		start := time.Now()
		err := g.stop(victim, !crash)
		if crash != errors.Is(err, lease.ErrClosed) || (!crash && err != nil) {
			t.Fatalf("round %d: Run of %s (crash %v) = %v", r, victim, crash, err)
		}
		ids = slices.DeleteFunc(ids, func(s string) bool { return s == victim })
		own := g.settle(2 * time.Minute)
		took := time.Since(start)
		if crash && took > ttl+poll+10*time.Second {
			t.Errorf("round %d: takeover of crashed %s took %v", r, victim, took)
		}
		mc.step(fmt.Sprintf("round %d: %s %s (%v)", r, map[bool]string{true: "crash", false: "leave"}[crash], victim, took), own, ids)
		join()
		start = time.Now()
		own = g.settle(2 * time.Minute)
		mc.step(fmt.Sprintf("round %d: join %s (%v)", r, ids[len(ids)-1], time.Since(start)), own, ids)
	}
	g.checkNoOverlap()
}

// restRate logs the statements per second the database runs while the
// group is at rest: its owners' fenced writes paused, and 15 s more for
// the writes in flight to end and the pools to go idle (a window opened at
// once counted the tail of the writes: 79/s instead of about 20). It then
// lists the statements of the window by calls, from pg_stat_statements.
// xact_commit counts every autocommit statement, and also pgxpool's
// pings of connections idle for over a second, which pg_stat_statements
// does not list.
func restRate(t *testing.T, g *group) {
	ctx := context.Background()
	conn := g.db.Conn(t)
	read := func() int64 {
		var c int64
		if _, err := conn.Exec(ctx, "select pg_stat_clear_snapshot()"); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, "select xact_commit + xact_rollback from pg_stat_database where datname = current_database()").Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	g.quiet.Store(true)
	defer g.quiet.Store(false)
	<-time.After(15 * time.Second) // let the writes in flight end: a measurement, not a synchronization
	if _, err := conn.Exec(ctx, "select pg_stat_statements_reset()"); err != nil {
		t.Fatal(err)
	}
	const window = 30 * time.Second
	a := read()
	start := time.Now()
	<-time.After(window) // a measurement window, not a synchronization
	b := read()
	el := time.Since(start).Seconds()
	own, _, _ := g.ownership()
	t.Logf("at rest: %d shards, %d members: %.2f transactions/s (%d in %.0f s)", len(own), len(g.members), float64(b-a)/el, b-a, el)
	rows, err := conn.Query(ctx, `select s.calls, left(regexp_replace(s.query, '\s+', ' ', 'g'), 100)
from pg_stat_statements s join pg_database d on d.oid = s.dbid
where d.datname = current_database() and s.query not like '%pg_stat%' order by calls desc limit 12`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var c int64
		var q string
		if err := rows.Scan(&c, &q); err != nil {
			t.Fatal(err)
		}
		t.Logf("at rest: %6.2f/s  %s", float64(c)/el, q)
	}
}
