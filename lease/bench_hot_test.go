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
	"github.com/pglocks/pglocks/lease"
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
// every 10 s) in one store and measures, over a 20 s window (two renewal
// intervals; the window is the measurement, nothing waits on it), the
// server's commits/s (every lease statement is its own transaction) and
// WAL writes/s (pg_stat_wal.wal_write: with the test servers' fsync off,
// each synchronous commit's flush is one write). Run with -benchtime 1x.
func BenchmarkKeepAlive10k(b *testing.B) {
	const n, ttl, window = 10000, 30 * time.Second, 20 * time.Second
	ctx := context.Background()
	_, pool, s := benchSetup(b, 8)
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
	stats := func() (commits, walWrites int64) {
		if err := pool.QueryRow(ctx, `select (select xact_commit from pg_stat_database where datname = current_database()),
			(select wal_write from pg_stat_wal)`).Scan(&commits, &walWrites); err != nil {
			b.Fatal(err)
		}
		return commits, walWrites
	}
	for b.Loop() {
		c0, w0 := stats()
		start := time.Now()
		t := time.NewTimer(window)
		<-t.C
		c1, w1 := stats()
		el := time.Since(start).Seconds()
		b.ReportMetric(float64(c1-c0)/el, "commits/s")
		b.ReportMetric(float64(w1-w0)/el, "walwrites/s")
	}
	lost := 0
	for _, l := range ls {
		if l != nil && l.Err() != nil {
			lost++
		}
	}
	b.ReportMetric(float64(lost), "lost")
}
