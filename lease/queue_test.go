package lease_test

import (
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// TestAcquireQueuesFIFO: the Acquire calls of one name in one
// store get the lease in the order they came, and a release wakes one of
// them, not all: 16 waiters cost a bounded number of acquire statements
// per hand-off, not one per waiter.
func TestAcquireQueuesFIFO(t *testing.T) {
	t.Parallel()
	const n = 16
	db := pgtest.New(t)
	c := &sqlCounter{match: isAcquire}
	pool := db.NewPool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = c; cfg.MaxConns = n + 2 })
	s := newStore(t, pool, lease.Config{})
	ctx := ctxT(t)
	holder := mustTry(t, s, "fifo", time.Minute)
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := range n {
		wg.Go(func() {
			l, err := s.Acquire(ctx, "fifo", time.Minute)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if err := l.Release(ctx); err != nil {
				t.Error(err)
			}
		})
		// The next waiter comes once this one waits.
		eventually(t, 30*time.Second, "waiter queued", func() bool { return lease.Parked(s) == int64(i+1) })
	}
	before := c.n.Load()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	stmts := c.n.Load() - before
	for i, w := range order {
		if w != i {
			t.Fatalf("acquired in order %v, want 0…%d", order, n-1)
		}
	}
	t.Logf("%d hand-offs, %d acquire statements (%.1f per hand-off)", n, stmts, float64(stmts)/n)
	if stmts > 4*n {
		t.Fatalf("%d acquire statements for %d hand-offs: waiters are woken in herds", stmts, n)
	}
}
