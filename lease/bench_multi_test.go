package lease_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/pglocks/pglocks/lease"
)

// BenchmarkMultiVsFloor runs, alternately in every iteration on one
// connection: SELECT 1 (the floor), the raw SQL lease pair, a semaphore's
// TryAcquire(1) + Release, a TryAcquireAll of 5 names + their 5 releases,
// and 5 TryAcquire + Release pairs of single names; it reports each per
// iteration and the ratios.
func BenchmarkMultiVsFloor(b *testing.B) {
	ctx := context.Background()
	db, _, s := benchSetup(b, 1)
	conn := db.Conn(b)
	l, err := s.TryAcquire(ctx, "raw", time.Minute) // create the raw pair's row
	if err != nil {
		b.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		b.Fatal(err)
	}
	sem, err := s.Semaphore("sem", 4)
	if err != nil {
		b.Fatal(err)
	}
	set := []string{"m0", "m1", "m2", "m3", "m4"}
	owner := uuid.New()
	var floor, raw, semPair, all, singles time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := conn.Exec(ctx, "select 1"); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := rawPair(ctx, conn, "raw", owner); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		p, err := sem.TryAcquire(ctx, 1, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Release(ctx); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		ls, err := s.TryAcquireAll(ctx, set, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		for _, l := range ls {
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		t4 := time.Now()
		for _, name := range set {
			l, err := s.TryAcquire(ctx, "s"+name, time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		t5 := time.Now()
		floor += t1.Sub(t0)
		raw += t2.Sub(t1)
		semPair += t3.Sub(t2)
		all += t4.Sub(t3)
		singles += t5.Sub(t4)
	}
	n := float64(b.N)
	b.ReportMetric(float64(floor.Nanoseconds())/n, "select1-ns")
	b.ReportMetric(float64(raw.Nanoseconds())/n, "rawpair-ns")
	b.ReportMetric(float64(semPair.Nanoseconds())/n, "sem1-ns")
	b.ReportMetric(float64(all.Nanoseconds())/n, "all5+5rel-ns")
	b.ReportMetric(float64(singles.Nanoseconds())/n, "5x(try+rel)-ns")
	b.ReportMetric(float64(semPair)/float64(raw), "sem1/rawpair")
	b.ReportMetric(float64(all)/float64(singles), "all5/5singles")
}

// BenchmarkSemaphoreThroughput runs TryAcquire(1) + Release of one
// semaphore from 32 goroutines, with limit 32 (free: each try should
// succeed) and limit 4 (contended: most tries find it full).
func BenchmarkSemaphoreThroughput(b *testing.B) {
	for _, limit := range []int{32, 4} {
		b.Run("clients=32/limit="+strconv.Itoa(limit), func(b *testing.B) {
			ctx := context.Background()
			const clients = 32
			_, pool, s := benchSetup(b, clients)
			warm(b, pool, s, clients)
			sem, err := s.Semaphore("sem", limit)
			if err != nil {
				b.Fatal(err)
			}
			var (
				next, pairs atomic.Int64
				wg          sync.WaitGroup
			)
			b.ResetTimer()
			start := time.Now()
			for range clients {
				wg.Go(func() {
					for next.Add(1) <= int64(b.N) {
						p, err := sem.TryAcquire(ctx, 1, time.Minute)
						if errors.Is(err, lease.ErrHeld) {
							continue
						}
						if err != nil {
							b.Error(err)
							return
						}
						if err := p.Release(ctx); err != nil {
							b.Error(err)
							return
						}
						pairs.Add(1)
					}
				})
			}
			wg.Wait()
			el := time.Since(start)
			b.ReportMetric(float64(pairs.Load())/el.Seconds(), "pairs/s")
			b.ReportMetric(float64(b.N)/el.Seconds(), "tries/s")
		})
	}
}
