package shard_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/shard"
)

// TestTakeoverBusyApplication: a member whose application holds every
// connection of its pool (its owners' work, saturated) takes over a dead
// member's shards when its Store has a pool of its own — the group's
// reads, the acquisitions and the renewals never wait behind the
// application — and logs how long after the death, by the server's clock
// (1.6–2.1 s with TTL 2 s, PollInterval 100 ms, at load 30–40). A Store
// sharing the busy pool holds none of them TTL + PollInterval + 3 s after
// the death: the bound counts on the Store's statements getting a
// connection. (TestProcChaos's members shared one pool of 8 between
// their Store and their owners' writes; at load 40–60 the writes kept
// every connection busy, the reads and acquisitions queued behind them,
// and takeovers after SIGKILL took 12–18 s against 11 s.)
func TestTakeoverBusyApplication(t *testing.T) {
	t.Parallel()
	for _, shared := range []bool{false, true} {
		t.Run(map[bool]string{false: "OwnPool", true: "SharedPool"}[shared], func(t *testing.T) {
			t.Parallel()
			takeoverBusy(t, shared)
		})
	}
}

// takeoverBusy runs members a and b over 20 shards, makes b's application
// take every connection of its pool (b's Store's too when shared), closes
// a's Store under it (its rows left to expire, as a crash leaves them),
// and checks, by the server's clock, that b takes a's shards while its
// application holds its pool — or, shared, that it holds none of them
// TTL + PollInterval (+ slack) after.
func takeoverBusy(t *testing.T, shared bool) {
	const ttl, poll, slack = 2 * time.Second, 100 * time.Millisecond, 3 * time.Second
	g := newGroup(t, 20, ttl, poll)
	pool := func(name string) *pgxpool.Pool {
		return g.db.NewPool(t, func(c *pgxpool.Config) {
			c.ConnConfig.RuntimeParams["application_name"] = name
			c.MaxConns = 2
		})
	}
	app := pool("b-app")
	storePool := app
	if !shared {
		storePool = pool("b")
	}
	member := func(id string, p *pgxpool.Pool) (*shard.Member, *lease.Store) {
		st, err := lease.New(p, lease.Config{Hostname: id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close(context.Background()) })
		m, err := shard.New(shard.Config{Group: g.name, Shards: g.shards, Store: st, Identity: id, TTL: ttl, PollInterval: poll})
		if err != nil {
			t.Fatal(err)
		}
		return m, st
	}
	a, aStore := member("a", pool("a"))
	b, _ := member("b", storePool)
	ra, rb := runMember(t, a), runMember(t, b)
	waitFor(t, time.Minute, "a and b own 10 shards each", func() bool {
		return rb.running(t) && len(a.Owned()) == 10 && len(b.Owned()) == 10
	})
	names := map[string]bool{}
	for _, s := range a.Owned() {
		names[g.name+"#s:"+s] = true
	}

	// b's application takes every connection of its pool and keeps them.
	ctx := t.Context()
	for range int(app.Config().MaxConns) {
		c, err := app.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
	}
	conn := g.db.Conn(t)
	var killed time.Time
	if err := conn.QueryRow(ctx, "select clock_timestamp()").Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if err := aStore.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "a's Run returns", func() bool {
		ra.mu.Lock()
		defer ra.mu.Unlock()
		return ra.over
	})
	if !errors.Is(ra.ended, lease.ErrClosed) {
		t.Fatalf("Run of a member whose Store closed = %v, want ErrClosed", ra.ended)
	}

	if shared {
		// a's shards by the server, once its clock is past the bound:
		// none held by b.
		deadline := killed.Add(ttl + poll + slack)
		var view map[string]string
		waitFor(t, time.Minute, "the server's clock past the bound", func() bool {
			var passed bool
			view, passed = holders(t, conn, names, deadline)
			return passed || len(view) > 0
		})
		if len(view) > 0 {
			t.Errorf("b, its Store's pool held by its application, took %d of a's shards: %v", len(view), view)
		}
		t.Logf("b, its Store's pool held by its application, took none of a's %d shards in TTL + PollInterval + %v", len(names), slack)
		return
	}
	// Every shard of a's held by b, its application's pool still held.
	// The time is logged by the server's clock, not asserted: on a loaded
	// machine the statements' time varies (TestProcChaos asserts it,
	// with a 5 s allowance).
	waitFor(t, time.Minute, "every shard of a's held by b, its application's pool held", func() bool {
		view, _ := holders(t, conn, names, killed)
		return len(view) == len(names)
	})
	var took time.Duration
	if err := conn.QueryRow(ctx, `select max(acquired_at) - $2::timestamptz from pglocks_leases where name = any($1)`,
		keys(names), killed).Scan(&took); err != nil {
		t.Fatal(err)
	}
	t.Logf("b, its application's pool held, took a's %d shards %v after a's Store closed, by the server's clock (TTL %v, poll %v)", len(names), took, ttl, poll)
}

// holders returns, of names, those held by b now (name → b's acquisition
// time), by the server, and whether the server's clock has passed
// deadline.
func holders(t *testing.T, conn *pgx.Conn, names map[string]bool, deadline time.Time) (map[string]string, bool) {
	var passed bool
	if err := conn.QueryRow(t.Context(), "select clock_timestamp() > $1", deadline).Scan(&passed); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(t.Context(), `select name, acquired_at from pglocks_leases
where name = any($1) and hostname = 'b' and owner is not null and expires_at > clock_timestamp()`, keys(names))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var name string
		var at time.Time
		if err := rows.Scan(&name, &at); err != nil {
			t.Fatal(err)
		}
		out[name] = fmt.Sprint(at)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out, passed
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
