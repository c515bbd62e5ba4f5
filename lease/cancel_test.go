package lease_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// TestCancelledAcquireStrandsNothing: 32 waiters on one name
// with random deadlines of 20–320 ms, each winner releasing at once, 30
// trials. An Acquire whose deadline ends while its statement waits for the
// row lock of a release may still commit on its backend after the client
// gave up; its cleanup must not run before that statement is over, or the
// name stays held for the whole TTL by an owner no caller received. After
// every trial (and the store's background cleanups), the name is free.
func TestCancelledAcquireStrandsNothing(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("30 trials of 32 waiters")
	}
	db := pgtest.New(t)
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 40 })
	ctx := ctxT(t)
	var stranded, acquired, cancelled, done atomic.Int64
	for trial := range 30 {
		s, err := lease.New(pool, lease.Config{})
		if err != nil {
			t.Fatal(err)
		}
		name := "hot" + string(rune('a'+trial%26)) + string(rune('a'+trial/26))
		holder := mustTry(t, s, name, time.Minute)
		var wg sync.WaitGroup
		done.Store(0)
		for range 32 {
			d := 20*time.Millisecond + rand.N(300*time.Millisecond)
			wg.Go(func() {
				defer done.Add(1)
				wctx, cancel := context.WithTimeout(ctx, d)
				defer cancel()
				l, err := s.Acquire(wctx, name, time.Minute)
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("acquire: %v", err)
					}
					cancelled.Add(1)
					return
				}
				acquired.Add(1)
				if err := l.Release(ctx); err != nil {
					t.Errorf("release: %v", err)
				}
			})
		}
		// Release once a waiter waits (or, on a slow machine, all gave up).
		eventually(t, 30*time.Second, "a waiting Acquire", func() bool { return lease.Parked(s) > 0 || done.Load() == 32 })
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if err := s.Close(ctx); err != nil { // waits for background cleanups
			t.Fatal(err)
		}
		var held bool
		if err := pool.QueryRow(ctx, `select owner is not null and expires_at > now() from pglocks_leases where name = $1`,
			name).Scan(&held); err != nil {
			t.Fatal(err)
		}
		if held {
			stranded.Add(1)
			t.Errorf("trial %d: %q is held after every caller returned", trial, name)
		}
	}
	t.Logf("30 trials: %d acquisitions, %d cancelled waits, %d names stranded", acquired.Load(), cancelled.Load(), stranded.Load())
}
