package shard_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// procView is the group's rows in the lease table at one moment, by the
// server clock: who owns what, as the server decides it.
type procView struct {
	members map[string]bool   // identities whose member row is held
	owner   map[string]string // shard → the identity holding its row unexpired
	row     map[string]string // shard → the identity its row names, held or not
	token   map[string]int64  // shard → its row's token
	rows    map[string]int64  // identity → its member row's token
}

// view reads the group's rows. The member processes' stores record their
// identity as the rows' hostname.
func (c *procCluster) view() procView {
	v := procView{members: map[string]bool{}, owner: map[string]string{}, row: map[string]string{}, token: map[string]int64{},
		rows: map[string]int64{}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, err := c.admin.Query(ctx, `select name, coalesce(hostname, ''), token,
	owner is not null and expires_at > now() from pglocks_leases where name like $1`, procGroup+"#%")
	if err != nil {
		c.t.Fatalf("read the lease table: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name, id string
		var token int64
		var held bool
		if err := rows.Scan(&name, &id, &token, &held); err != nil {
			c.t.Fatal(err)
		}
		if m, ok := strings.CutPrefix(name, procGroup+"#m:"); ok {
			v.members[m] = v.members[m] || held
			v.rows[m] = token
		} else if s, ok := strings.CutPrefix(name, procGroup+"#s:"); ok {
			v.row[s], v.token[s] = id, token
			if held {
				v.owner[s] = id
			}
		}
	}
	if err := rows.Err(); err != nil {
		c.t.Fatalf("read the lease table: %v", err)
	}
	return v
}

// loads counts the shards each of live holds in v (zero included).
func (v procView) loads(live []string) map[string]int {
	load := map[string]int{}
	for _, id := range live {
		load[id] = 0
	}
	for _, id := range v.owner {
		if _, ok := load[id]; ok {
			load[id]++
		}
	}
	return load
}

// spread is max − min of loads.
func spread(load map[string]int) int {
	if len(load) == 0 {
		return 0
	}
	vs := slices.Collect(maps.Values(load))
	return slices.Max(vs) - slices.Min(vs)
}

// settledFor reports whether v is settled for the live members: their
// member rows and no other are held, every shard is held by one of them,
// and loads differ by at most one.
func (c *procCluster) settledFor(v procView, live []string) bool {
	if len(v.members) == 0 || len(v.owner) != c.cfg.shards {
		return false
	}
	var held []string
	for id, ok := range v.members {
		if ok {
			held = append(held, id)
		}
	}
	slices.Sort(held)
	if !slices.Equal(held, live) {
		return false
	}
	load := v.loads(live)
	n := 0
	for _, k := range load {
		n += k
	}
	return n == c.cfg.shards && spread(load) <= 1
}

// poll reads the view every d until try accepts one, and fails the test
// if none did within the deadline.
func (c *procCluster) poll(d, within time.Duration, what string, try func(procView) bool) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		v := c.view()
		if try(v) {
			return
		}
		if time.Now().After(deadline) {
			c.dumpTails()
			c.t.Fatalf("not within %v: %s; the server's view: %s", within, what, v.describe(c.live()))
		}
		<-tick.C
	}
}

// describe summarizes v for a failure message.
func (v procView) describe(live []string) string {
	unowned, foreign := 0, map[string]int{}
	for s, id := range v.row {
		if v.owner[s] == "" {
			unowned++
		} else if !slices.Contains(live, id) {
			foreign[id]++
		}
	}
	return fmt.Sprintf("member rows held %v, live %v, loads %v, %d shards unowned, held by others than the live: %v",
		v.members, live, v.loads(live), unowned, foreign)
}

// settle waits until the view is settled for the live members and has
// stayed unchanged for cfg.quiet (every member read the member list
// twice meanwhile, so no move is pending), and returns the ownership and
// how long after the call that state began.
func (c *procCluster) settle(what string) (map[string]string, time.Duration) {
	c.t.Helper()
	live, start := c.live(), time.Now()
	var last map[string]int64
	var since time.Time
	var own map[string]string
	c.poll(100*time.Millisecond, c.cfg.settleWithin, what+": settle", func(v procView) bool {
		if !c.settledFor(v, live) {
			last = nil
			return false
		}
		if !maps.Equal(last, v.token) {
			last, since = v.token, time.Now()
		}
		own = v.owner
		return time.Since(since) >= c.cfg.quiet()
	})
	return own, since.Sub(start)
}

// waitTakeover waits until every shard victim held in before is held by
// another live member, and returns how long after t0 the first view
// showing it was read.
func (c *procCluster) waitTakeover(victim string, before map[string]string, t0 time.Time) time.Duration {
	c.t.Helper()
	live := c.live()
	var took time.Duration
	c.poll(50*time.Millisecond, c.cfg.settleWithin, "takeover of "+victim+"'s shards", func(v procView) bool {
		for s, id := range before {
			if id == victim && (v.owner[s] == victim || !slices.Contains(live, v.owner[s])) {
				return false
			}
		}
		took = time.Since(t0)
		return true
	})
	return took
}

// waitAway waits, while victim is stopped (SIGSTOP), until its member row
// is no longer held and every shard it held in before is held by another
// live member — except the stuck ones: rows locked by a guarded
// transaction it had open when it stopped (a takeover waits for it: see
// lease's Fencing), which must stay so for cfg.quiet. It returns how long
// after t0 that state began, and the stuck shards.
func (c *procCluster) waitAway(victim string, before map[string]string, t0 time.Time) (time.Duration, []string) {
	c.t.Helper()
	live := c.live()
	var stuck []string
	var since time.Time
	c.poll(50*time.Millisecond, c.cfg.settleWithin, "takeover of stopped "+victim+"'s shards", func(v procView) bool {
		if v.members[victim] {
			return false
		}
		var now []string
		for s, id := range before {
			if id != victim {
				continue
			}
			switch o := v.owner[s]; {
			case o == victim:
				return false
			case o == "" && v.row[s] == victim:
				now = append(now, s)
			case !slices.Contains(live, o):
				return false
			}
		}
		slices.Sort(now)
		if since.IsZero() || !slices.Equal(now, stuck) {
			stuck, since = now, time.Now()
		}
		if len(stuck) > 0 && !slices.Equal(stuck, c.lockedRows(victim)) {
			return false // a row not locked: not stuck, only not yet taken
		}
		return time.Since(since) >= c.cfg.quiet()
	})
	return since.Sub(t0), stuck
}

// lockedRows returns, sorted, the shards whose lease row a transaction of
// member id holds locked now (a Guard's FOR SHARE): rows whose xmax is
// the transaction id of one of id's sessions. A stopped member's locks
// are all there once no session of its runs a statement (activeTx).
func (c *procCluster) lockedRows(id string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, err := c.admin.Query(ctx, `select substr(l.name, length($2) + 1) from pglocks_leases l
	join pg_stat_activity a on a.backend_xid = l.xmax
	where a.datname = current_database() and a.application_name = $1 and l.name like $2 || '%'
	order by 1`, id, procGroup+"#s:")
	if err != nil {
		c.t.Fatal(err)
	}
	shards, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		c.t.Fatal(err)
	}
	slices.Sort(shards) // by Go's order, as waitAway's
	return shards
}

// activeTx counts id's sessions running a statement, those waiting for a
// lock aside: the server finishes the others' statements even when id is
// stopped; a lock waited for may be one of id's own open transactions'.
func (c *procCluster) activeTx(id string) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var n int
	if err := c.admin.QueryRow(ctx, `select count(*) from pg_stat_activity
	where datname = current_database() and application_name = $1 and state = 'active'
	and wait_event_type is distinct from 'Lock'`, id).Scan(&n); err != nil {
		c.t.Fatal(err)
	}
	return n
}
