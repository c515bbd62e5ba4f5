package lease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// batchFixture is a store on a pool of its own (through PgBouncer under
// TestViaTransactionBouncer), with a check connection.
type batchFixture struct {
	db    *pgtest.DB
	pool  *pgxpool.Pool
	s     *lease.Store
	ctx   context.Context
	check *pgx.Conn
}

func newBatchFixture(t *testing.T) batchFixture {
	db := pgtest.New(t)
	pool := poolFor(t, db, func(c *pgxpool.Config) { c.MaxConns = 24 })
	return batchFixture{db: db, pool: pool, s: newStore(t, pool, lease.Config{}), ctx: ctxT(t), check: db.Conn(t)}
}

// lockWaits waits until n statements of the database wait for a row lock.
func (f batchFixture) lockWaits(t *testing.T, n int) {
	t.Helper()
	eventually(t, time.Minute, fmt.Sprintf("%d statements waiting for a row lock", n), func() bool {
		var c int
		err := f.check.QueryRow(f.ctx, `select count(*) from pg_stat_activity
			where datname = current_database() and wait_event_type = 'Lock'`).Scan(&c)
		return err == nil && c >= n
	})
}

// names returns prefix0 … prefix{n-1}.
func names(prefix string, n int) []string {
	var ns []string
	for i := range n {
		ns = append(ns, fmt.Sprintf("%s%d", prefix, i))
	}
	return ns
}

// TestBatchedReleases: releases that find a store's direct statements all
// in flight (here: blocked by guarded rows) queue and run in batches. A
// batch waits for no row lock: a guarded row holds back only its own
// release, which then waits alone, while the other releases of its batch
// complete.
func TestBatchedReleases(t *testing.T) {
	t.Parallel()
	f := newBatchFixture(t)
	s, ctx, pool := f.s, f.ctx, f.pool
	// Releases: g0 … g{n-1} are guarded, so their releases hold all the
	// direct slots, blocked; gn is guarded too, and queued.
	n := lease.DefaultBatchAfter
	guarded := make([]*lease.Lease, n+1)
	var txs []pgx.Tx
	for i := range guarded {
		guarded[i] = mustTry(t, s, fmt.Sprintf("g%d", i), time.Minute)
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		if err := guarded[i].Guard(ctx, tx); err != nil {
			t.Fatal(err)
		}
		txs = append(txs, tx)
	}
	var free []*lease.Lease
	for _, name := range names("r", 10) {
		free = append(free, mustTry(t, s, name, time.Minute))
	}
	slow := make(chan error, n+1)
	for _, l := range guarded[:n] {
		go func() { slow <- l.Release(ctx) }()
	}
	f.lockWaits(t, n)
	go func() { slow <- guarded[n].Release(ctx) }()
	concurrently(t, free, func(l *lease.Lease) error { return l.Release(ctx) })
	if n := countHeld(t, pool, "r%"); n != 0 {
		t.Fatalf("%d of the batched releases left their row held", n)
	}
	f.lockWaits(t, n+1) // gn's release, skipped by its batch, waits alone
	for _, tx := range txs {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range n + 1 {
		if err := <-slow; err != nil {
			t.Fatalf("release of a guarded lease: %v", err)
		}
	}
}

// TestBatchedRetakes: retakes of names a store released that find its
// direct statements all in flight (here: blocked by locked rows) queue and
// run in batches; a locked row holds back only its own retake.
func TestBatchedRetakes(t *testing.T) {
	t.Parallel()
	f := newBatchFixture(t)
	s, ctx, pool := f.s, f.ctx, f.pool
	n := lease.DefaultBatchAfter
	var free []*lease.Lease
	for _, name := range names("r", 10) {
		l := mustTry(t, s, name, time.Minute)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		free = append(free, l)
	}
	late, commit := f.blockRetakes(t, n)
	taken := make([]*lease.Lease, len(free))
	concurrently(t, names("r", 10), func(name string) error {
		l, err := s.TryAcquire(ctx, name, time.Minute)
		if err == nil {
			var i int
			_, _ = fmt.Sscanf(name, "r%d", &i)
			taken[i] = l
		}
		return err
	})
	for i, l := range taken {
		if l == nil {
			t.Fatalf("r%d not taken", i)
		}
		if l.Token() <= free[i].Token() {
			t.Fatalf("%s: token %d after %d", l.Name(), l.Token(), free[i].Token())
		}
	}
	f.lockWaits(t, n+1) // xn's retake, skipped by its batch, waits alone
	commit()
	for range n + 1 {
		var g tried
		select {
		case g = <-late:
		case <-time.After(time.Minute):
			t.Fatal("a retake of a locked row did not return after the commit")
		}
		if g.err != nil {
			t.Fatalf("retake of a locked row: %v", g.err)
		}
		taken = append(taken, g.l)
	}
	concurrently(t, taken, func(l *lease.Lease) error { return l.Release(ctx) })
	if n := countHeld(t, pool, "%"); n != 0 {
		t.Fatalf("%d rows still held", n)
	}
}

// tried is the outcome of a TryAcquire.
type tried struct {
	l   *lease.Lease
	err error
}

// blockRetakes makes the store's retakes of x0 … x{n-1} hold all its n
// direct slots, blocked by locked rows, and queues the retake of xn,
// whose row is locked too. The retakes report on late once commit has
// ended the locking transaction.
func (f batchFixture) blockRetakes(t *testing.T, n int) (late chan tried, commit func()) {
	t.Helper()
	for _, x := range names("x", n+1) {
		if err := mustTry(t, f.s, x, time.Minute).Release(f.ctx); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := f.db.Conn(t).Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(f.ctx, "select from pglocks_leases where name like 'x%' for update"); err != nil {
		t.Fatal(err)
	}
	late = make(chan tried, n+1)
	for _, x := range names("x", n+1) {
		go func() { l, err := f.s.TryAcquire(f.ctx, x, time.Minute); late <- tried{l, err} }()
		if x == fmt.Sprintf("x%d", n-1) {
			f.lockWaits(t, n) // the direct slots are all taken: xn queues
		}
	}
	return late, func() {
		if err := tx.Commit(f.ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// concurrently runs f on every item at once, within a minute.
func concurrently[T any](t *testing.T, items []T, f func(T) error) {
	t.Helper()
	var wg sync.WaitGroup
	for _, it := range items {
		wg.Go(func() {
			if err := f(it); err != nil {
				t.Error(err)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	waitFor(t, done, time.Minute, "the concurrent calls")
}

// countHeld returns how many rows whose name is like pattern are held.
func countHeld(t *testing.T, pool *pgxpool.Pool, pattern string) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), "select count(*) from pglocks_leases where name like $1 and owner is not null and expires_at > now()",
		pgx.QueryExecModeExec, pattern).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
