package lease_test

import (
	"context"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// TestSharedStress: workers in three stores take one shared lease as
// readers (four in five) and writers, and check on each hold that no
// writer was in with anyone else: readers ≥ 0 with no writer, or one
// writer alone. The default size runs in a few seconds;
// PGLOCKS_STRESS=1 runs 10,000 holds.
func TestSharedStress(t *testing.T) {
	t.Parallel()
	ops := 200
	if os.Getenv("PGLOCKS_STRESS") == "1" {
		ops = 10_000
	}
	b := setup(t)
	stores := []*lease.Store{b.store, newStore(t, b.pool, lease.Config{}), newStore(t, b.pool, lease.Config{})}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var (
		readers, writers atomic.Int64
		reads, writes    atomic.Int64
		violations       atomic.Int64
		left             = atomic.Int64{}
		wg               sync.WaitGroup
	)
	left.Store(int64(ops))
	start := time.Now()
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[i%len(stores)]
			for left.Add(-1) >= 0 && ctx.Err() == nil {
				write := rand.N(5) == 0
				var (
					l   *lease.Lease
					err error
				)
				if write {
					l, err = s.AcquireExclusive(ctx, "hot", 30*time.Second)
				} else {
					l, err = s.AcquireShared(ctx, "hot", 30*time.Second)
				}
				if err != nil {
					t.Error(err)
					return
				}
				if write {
					if writers.Add(1) != 1 || readers.Load() != 0 {
						violations.Add(1)
					}
					runtime.Gosched()
					writers.Add(-1)
					writes.Add(1)
				} else {
					readers.Add(1)
					if writers.Load() != 0 {
						violations.Add(1)
					}
					runtime.Gosched()
					readers.Add(-1)
					reads.Add(1)
				}
				if err := l.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	t.Logf("%d reads and %d writes of one shared lease by 12 workers in 3 stores in %v (%.0f holds/s)",
		reads.Load(), writes.Load(), d.Round(time.Millisecond), float64(reads.Load()+writes.Load())/d.Seconds())
	if n := violations.Load(); n != 0 {
		t.Fatalf("%d holds overlapped a writer's", n)
	}
}
