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
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// BenchmarkHotAcquire: 8, 32 and 64 goroutines acquire one name with the
// blocking Acquire and release it at once (ours), beside the raw SQL a
// user would write instead — the conditional UPDATE tried again at once
// until it takes the row, then the release (raw) — and the floor, SELECT 1
// from as many goroutines (select1). Every iteration runs the three for
// 250 ms each in turn, so that a noisy machine slows all three alike;
// acquisitions/s of each, and ours/raw, are reported.
func BenchmarkHotAcquire(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{8, 32, 64} {
		b.Run(fmt.Sprintf("waiters=%d", n), func(b *testing.B) {
			_, pool, s := benchSetup(b, int32(n))
			l, err := s.TryAcquire(ctx, "raw", time.Minute) // create the raw row
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
			phases := []func() error{
				func() error { _, err := pool.Exec(ctx, "select 1"); return err },
				func() error {
					owner := uuid.New()
					for {
						if err := rawPair(ctx, pool, "raw", owner); !errors.Is(err, pgx.ErrNoRows) {
							return err
						}
					}
				},
				func() error {
					l, err := s.Acquire(ctx, "hot", time.Minute)
					if err != nil {
						return err
					}
					return l.Release(ctx)
				},
			}
			var counts [3]int64
			var spent [3]time.Duration
			for b.Loop() {
				for i, op := range phases {
					c, d := hotPhase(b, n, 250*time.Millisecond, op)
					counts[i] += c
					spent[i] += d
				}
			}
			rate := func(i int) float64 { return float64(counts[i]) / spent[i].Seconds() }
			b.ReportMetric(rate(0), "select1/s")
			b.ReportMetric(rate(1), "raw-acq/s")
			b.ReportMetric(rate(2), "ours-acq/s")
			b.ReportMetric(rate(2)/rate(1), "ours/raw")
		})
	}
}

// hotPhase runs op from n goroutines until d has passed (the phase's
// length is what is measured) and returns how many ops completed, and in
// how long.
func hotPhase(b *testing.B, n int, d time.Duration, op func() error) (int64, time.Duration) {
	var (
		done atomic.Int64
		stop atomic.Bool
		wg   sync.WaitGroup
	)
	start := time.Now()
	t := time.AfterFunc(d, func() { stop.Store(true) })
	defer t.Stop()
	for range n {
		wg.Go(func() {
			for !stop.Load() {
				if err := op(); err != nil {
					b.Error(err)
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	return done.Load(), time.Since(start)
}

// BenchmarkKeepAlive10k keeps 10,000 leases of TTL 30 s alive (renewed
// every 10 s, checked every 5 s in between) in one store and counts, over
// a 20 s window (two renewal intervals; the window is the measurement,
// nothing waits on it), the statements the store sends per second and
// those that renew — each a commit that flushes the WAL. They are counted
// by a tracer on the store's pool: the server's own counters are
// cluster-wide and flushed late.
func BenchmarkKeepAlive10k(b *testing.B) {
	const n, ttl, window = 10000, 30 * time.Second, 20 * time.Second
	ctx := context.Background()
	db := pgtest.New(b)
	c := &sqlCounter{match: isRenewal}
	pool := db.NewPool(b, func(cfg *pgxpool.Config) { cfg.MaxConns, cfg.ConnConfig.Tracer = 8, c })
	s := newStore(b, pool, lease.Config{})
	ls := make([]*lease.Lease, n)
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range 8 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < n; i = next.Add(1) - 1 {
				l, err := s.TryAcquire(ctx, fmt.Sprintf("ka%05d", i), ttl, lease.WithKeepAlive())
				if err != nil {
					b.Error(err)
					return
				}
				ls[i] = l
			}
		})
	}
	wg.Wait()
	for b.Loop() {
		all0, renew0 := c.all.Load(), c.n.Load()
		start := time.Now()
		t := time.NewTimer(window)
		<-t.C
		el := time.Since(start).Seconds()
		b.ReportMetric(float64(c.all.Load()-all0)/el, "stmts/s")
		b.ReportMetric(float64(c.n.Load()-renew0)/el, "renewals/s")
	}
	lost := 0
	for _, l := range ls {
		if l != nil && l.Err() != nil {
			lost++
		}
	}
	b.ReportMetric(float64(lost), "lost")
}
