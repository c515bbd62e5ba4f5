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

// TestBatches: releases and fast retakes of a store that find its direct
// statements all in flight (here: blocked by row locks) queue and run in
// batches. A batch waits for no row lock: a guarded or locked row holds
// back only its own call, which then waits alone, while the other calls of
// its batch complete.
func TestBatches(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pool := poolFor(t, db, func(c *pgxpool.Config) { c.MaxConns = 24 })
	s := newStore(t, pool, lease.Config{})
	ctx := ctxT(t)
	check := db.Conn(t)
	lockWaits := func(n int) {
		t.Helper()
		eventually(t, time.Minute, fmt.Sprintf("%d statements waiting for a row lock", n), func() bool {
			var c int
			err := check.QueryRow(ctx, `select count(*) from pg_stat_activity
				where datname = current_database() and wait_event_type = 'Lock'`).Scan(&c)
			return err == nil && c >= n
		})
	}
	names := func(prefix string, n int) []string {
		var ns []string
		for i := range n {
			ns = append(ns, fmt.Sprintf("%s%d", prefix, i))
		}
		return ns
	}

	// Releases: g0 … g{n-1} are guarded, so their releases hold all the
	// direct slots, blocked; gn is guarded too, and queued.
	n := lease.DirectMax
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
	lockWaits(n)
	go func() { slow <- guarded[n].Release(ctx) }()
	concurrently(t, free, func(l *lease.Lease) error { return l.Release(ctx) })
	if n := countHeld(t, pool, "r%"); n != 0 {
		t.Fatalf("%d of the batched releases left their row held", n)
	}
	lockWaits(n + 1) // gn's release, skipped by its batch, waits alone
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

	// Fast retakes of names the store released: x0 … x{n-1} are locked,
	// so their retakes hold all the direct slots; xn is locked too, and
	// queued.
	for _, x := range names("x", n+1) {
		if err := mustTry(t, s, x, time.Minute).Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	locker := db.Conn(t)
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, "select from pglocks_leases where name like 'x%' for update"); err != nil {
		t.Fatal(err)
	}
	type got struct {
		l   *lease.Lease
		err error
	}
	late := make(chan got, n+1)
	for _, x := range names("x", n+1) {
		go func() { l, err := s.TryAcquire(ctx, x, time.Minute); late <- got{l, err} }()
		if x == fmt.Sprintf("x%d", n-1) {
			lockWaits(n) // the direct slots are all taken: xn queues
		}
	}
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
		if l.Token() <= free[i].Token() {
			t.Fatalf("%s: token %d after %d", l.Name(), l.Token(), free[i].Token())
		}
	}
	lockWaits(n + 1) // xn's retake, skipped by its batch, waits alone
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for range n + 1 {
		g := <-late
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
