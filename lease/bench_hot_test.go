package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// BenchmarkHotAcquire: 8, 32 and 64 goroutines acquire one name with the
// blocking Acquire and release it at once (Acquire), beside the raw SQL a
// user would write instead — the conditional UPDATE tried again at once
// until it takes the row, then the release (Raw) — and the floor, SELECT 1
// from as many goroutines (Select1). acq/s counts acquisitions.
func BenchmarkHotAcquire(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{8, 32, 64} {
		b.Run(fmt.Sprintf("Select1/waiters=%d", n), func(b *testing.B) {
			_, pool, _ := benchSetup(b, int32(n))
			hotRun(b, n, func() error { _, err := pool.Exec(ctx, "select 1"); return err })
		})
		b.Run(fmt.Sprintf("Raw/waiters=%d", n), func(b *testing.B) {
			_, pool, s := benchSetup(b, int32(n))
			l, err := s.TryAcquire(ctx, "hot", time.Minute) // create the row
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
			hotRun(b, n, func() error {
				owner := uuid.New()
				for {
					err := rawPair(ctx, pool, "hot", owner)
					if !errors.Is(err, pgx.ErrNoRows) {
						return err
					}
				}
			})
		})
		b.Run(fmt.Sprintf("Acquire/waiters=%d", n), func(b *testing.B) {
			_, _, s := benchSetup(b, int32(n))
			hotRun(b, n, func() error {
				l, err := s.Acquire(ctx, "hot", time.Minute)
				if err != nil {
					return err
				}
				return l.Release(ctx)
			})
		})
	}
}

// hotRun runs op b.N times from n goroutines and reports acq/s.
func hotRun(b *testing.B, n int, op func() error) {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	b.ResetTimer()
	start := time.Now()
	for range n {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := op(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "acq/s")
}
