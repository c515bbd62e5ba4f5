package shard_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/shard"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if runProcChild() {
		return // a member process of TestProcChaos: it exits in runProcChild
	}
	opts := []pgtest.Option{}
	if os.Getenv("PGLOCKS_STRESS") != "" {
		// restRate's breakdown of the statements at rest.
		opts = append(opts, pgtest.WithSetting("shared_preload_libraries", "pg_stat_statements"),
			pgtest.WithSetting("pg_stat_statements.track", "all"))
	}
	goleak.VerifyTestMain(pgtest.WrapMain(m, append(opts, pgtest.WithTemplate(func(ctx context.Context, conn *pgx.Conn) error {
		if os.Getenv("PGLOCKS_STRESS") != "" {
			if _, err := conn.Exec(ctx, "create extension if not exists pg_stat_statements"); err != nil {
				return err
			}
		}
		ddl, err := lease.SchemaSQL(lease.Config{})
		if err != nil {
			return err
		}
		if _, err = conn.Exec(ctx, ddl); err != nil {
			return err
		}
		// The fence checker's tables: the highest token that wrote per
		// shard, and every refused (lower) write.
		_, err = conn.Exec(ctx, `create table fence (shard text primary key, token bigint not null, member text not null);
create table overlap (shard text, token bigint, member text, seen bigint, at timestamptz default clock_timestamp())`)
		return err
	}))...))
}

// group is the test's view of a set of members of one group, each with
// its own pool and Store, as separate processes would have.
type group struct {
	t      *testing.T
	db     *pgtest.DB
	name   string
	shards []string
	ttl    time.Duration
	poll   time.Duration

	mu      sync.Mutex
	members map[string]*runner
	writes  int64
	quiet   atomic.Bool // owners skip their writes (a measurement at rest)
}

type runner struct {
	m      *shard.Member
	store  *lease.Store
	pool   *pgxpool.Pool
	cancel context.CancelFunc
	done   chan error
}

func newGroup(t *testing.T, n int, ttl, poll time.Duration) *group {
	shards := make([]string, n)
	for i := range shards {
		shards[i] = fmt.Sprint(i)
	}
	return &group{t: t, db: pgtest.New(t), name: "g", shards: shards, ttl: ttl, poll: poll, members: map[string]*runner{}}
}

// join starts member id with its own pools (application_name id) and
// store: one pool for its owners' writes, one for the store, which the
// writes then never keep busy (see TestTakeoverBusyApplication).
func (g *group) join(id string) *runner {
	t := g.t
	newPool := func() *pgxpool.Pool {
		return g.db.NewPool(t, func(c *pgxpool.Config) {
			c.ConnConfig.RuntimeParams["application_name"] = id
			c.MaxConns = 8
		})
	}
	pool := newPool()
	st, err := lease.New(newPool(), lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := shard.New(shard.Config{Group: g.name, Shards: g.shards, Store: st, Identity: id, TTL: g.ttl, PollInterval: g.poll})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{m: m, store: st, pool: pool, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- m.Run(ctx, func(ctx context.Context, s shard.Shard) { g.work(ctx, pool, id, s) }) }()
	t.Cleanup(func() { g.stop(id, true) })
	g.mu.Lock()
	g.members[id] = r
	g.mu.Unlock()
	return r
}

// stop ends member id: leaving (release) or, with leave false, closing
// its store under it, as a crash leaves its rows. It returns Run's error.
func (g *group) stop(id string, leave bool) error {
	g.mu.Lock()
	r := g.members[id]
	delete(g.members, id)
	g.mu.Unlock()
	if r == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if !leave {
		_ = r.store.Close(ctx) // Run returns on its own
	} else {
		r.cancel()
	}
	var err error
	select {
	case err = <-r.done:
	case <-ctx.Done():
		g.t.Errorf("member %s: Run did not return", id)
	}
	r.cancel()
	_ = r.store.Close(ctx)
	return err
}

// work is each owner's fn: a fenced write when the term starts and then
// every N/2 ms (at least 20ms: 100 shards, 2,000 writes/s in all) until
// it ends. A write carrying a lower token than one that
// already wrote for the shard is recorded in overlap: two trusted owners.
func (g *group) work(ctx context.Context, pool *pgxpool.Pool, id string, s shard.Shard) {
	for {
		if g.quiet.Load() {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := s.Guard(ctx, tx); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `with prev as (select token from fence where shard = $1 for update),
ins as (insert into overlap (shard, token, member, seen) select $1, $2, $3, token from prev where token > $2)
insert into fence (shard, token, member) values ($1, $2, $3)
on conflict (shard) do update set token = excluded.token, member = excluded.member where fence.token <= excluded.token`,
				s.Name, s.Token, id)
			return err
		})
		var pgErr *pgconn.PgError
		if err == nil {
			g.mu.Lock()
			g.writes++
			g.mu.Unlock()
		} else if ctx.Err() == nil && !errors.Is(err, lease.ErrNotHeld) &&
			errors.As(err, &pgErr) && pgErr.Code != "57P01" {
			// A terminated connection is the test's doing; any other
			// refusal by the server is a bug.
			g.t.Errorf("fenced write of shard %s by %s: %v", s.Name, id, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(20*time.Millisecond, time.Duration(len(g.shards))*time.Millisecond/2)):
		}
	}
}

// checkNoOverlap fails the test if any fenced write came after a higher
// token's, and logs how many fenced writes committed.
func (g *group) checkNoOverlap() {
	g.mu.Lock()
	g.t.Logf("%d fenced writes committed", g.writes)
	g.mu.Unlock()
	var n int
	if err := g.db.Conn(g.t).QueryRow(context.Background(), "select count(*) from overlap").Scan(&n); err != nil {
		g.t.Fatal(err)
	}
	if n != 0 {
		g.t.Fatalf("%d fenced writes came from a superseded owner", n)
	}
}

// ownership returns shard → member from every running member's Owned,
// and fails the test if two claim one shard.
// ownership reads every member's Owned, one member after another: a shard
// moving meanwhile may show under its old owner and its new one. That is
// no double ownership (Owned is a snapshot, not a trust signal; the fenced
// writes are the safety check), only a state not yet settled: such shards
// come back in moving.
func (g *group) ownership() (own map[string]string, load map[string]int, moving []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	own, load = map[string]string{}, map[string]int{}
	for id, r := range g.members {
		for _, s := range r.m.Owned() {
			if _, ok := own[s]; ok {
				moving = append(moving, s)
				continue
			}
			own[s] = id
			load[id]++
		}
	}
	return own, load, moving
}

// settle waits until every running member owns exactly its share of the
// current member set, and returns the ownership then.
func (g *group) settle(within time.Duration) map[string]string {
	g.t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if own, ok := g.settled(); ok {
			return own
		}
		if time.Now().After(deadline) {
			own, load, moving := g.ownership()
			g.dump(own)
			g.t.Fatalf("not settled within %v: %d of %d shards owned, loads %v, shown under two members %v", within, len(own), len(g.shards), load, moving)
		}
		<-tick.C
	}
}

// dump logs what a group that did not settle shows: each member's owned
// and target counts, and the server's rows of its members and of the
// shards no member owns.
func (g *group) dump(own map[string]string) {
	g.mu.Lock()
	ids := slices.Sorted(maps.Keys(g.members))
	rs := maps.Clone(g.members)
	g.mu.Unlock()
	var free, names []string
	for _, s := range g.shards {
		if _, ok := own[s]; !ok {
			free = append(free, s)
			names = append(names, g.name+"#s:"+s)
		}
	}
	// Each member's view of every member's share, and of who should take
	// the shards nobody owns: members that disagree show here.
	for _, id := range ids {
		shares, takers := map[string]int{}, map[string][]string{}
		for _, x := range ids {
			t := rs[id].m.Target(x, ids)
			shares[x] = len(t)
			for _, s := range free {
				if slices.Contains(t, s) {
					takers[s] = append(takers[s], x)
				}
			}
		}
		g.t.Logf("member %s: owns %d; its view of the shares %v, of the free shards' takers %v", id, len(rs[id].m.Owned()), shares, takers)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := g.db.NewPool(g.t).Query(ctx, `select name, coalesce(owner::text, '-'), token, extract(epoch from expires_at - clock_timestamp()),
		extract(epoch from renewed_at - acquired_at), coalesce(metadata::text, '')
		from pglocks_leases where name like $1 || '#m:%' or name = any($2) order by name`, g.name, names)
	if err != nil {
		g.t.Logf("dump: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var name, owner, md string
		var token int64
		var left, held float64
		if err := rows.Scan(&name, &owner, &token, &left, &held, &md); err != nil {
			g.t.Logf("dump: %v", err)
			return
		}
		g.t.Logf("row %s: owner %s token %d expires in %.3fs, renewed for %.3fs, metadata %s", name, owner, token, left, held, md)
	}
}

func (g *group) settled() (map[string]string, bool) {
	own, _, moving := g.ownership()
	if len(moving) > 0 {
		return nil, false
	}
	g.mu.Lock()
	ids := slices.Sorted(maps.Keys(g.members))
	rs := maps.Clone(g.members)
	g.mu.Unlock()
	if len(own) != len(g.shards) {
		return nil, false
	}
	for _, id := range ids {
		if !slices.Equal(rs[id].m.Owned(), sorted(rs[id].m.Target(id, ids))) {
			return nil, false
		}
	}
	return own, true
}

func sorted(s []string) []string { slices.Sort(s); return s }

// balanced fails the test unless loads differ by at most one.
func (g *group) balanced(own map[string]string) {
	load := map[string]int{}
	for _, m := range own {
		load[m]++
	}
	lo, hi := len(g.shards), 0
	for _, n := range load {
		lo, hi = min(lo, n), max(hi, n)
	}
	if hi-lo > 1 {
		g.t.Fatalf("loads %v differ by more than one", load)
	}
}

func movedCount(a, b map[string]string) int {
	n := 0
	for s, m := range a {
		if b[s] != m {
			n++
		}
	}
	return n
}
