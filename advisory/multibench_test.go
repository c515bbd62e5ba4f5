package advisory_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// BenchmarkSemaphoreVsFloor interleaves, in every iteration, the floor
// (SELECT 1 on a pinned connection), the raw pair pg_try_advisory_lock +
// pg_advisory_unlock on that connection, and Semaphore.TryAcquire(1) +
// Release on a semaphore of 3, so that a noisy machine slows all three
// alike; it reports each one's time and the ratios to the floor.
func BenchmarkSemaphoreVsFloor(b *testing.B) {
	l, _, _ := benchLocker(b, advisory.Config{})
	sem, err := l.Semaphore("bench", 3)
	if err != nil {
		b.Fatal(err)
	}
	conn := pgtest.New(b).Conn(b)
	ctx := context.Background()
	var floor, raw, ours time.Duration
	var one int
	var ok bool
	for b.Loop() {
		t0 := time.Now()
		if err := conn.QueryRow(ctx, "select 1").Scan(&one); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := conn.QueryRow(ctx, "select pg_try_advisory_lock($1)", int64(42)).Scan(&ok); err != nil || !ok {
			b.Fatal(err, ok)
		}
		if err := conn.QueryRow(ctx, "select pg_advisory_unlock($1)", int64(42)).Scan(&ok); err != nil || !ok {
			b.Fatal(err, ok)
		}
		t2 := time.Now()
		p, err := sem.TryAcquire(ctx, 1)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Release(ctx); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		floor += t1.Sub(t0)
		raw += t2.Sub(t1)
		ours += t3.Sub(t2)
	}
	n := float64(b.N)
	b.ReportMetric(float64(floor.Nanoseconds())/n, "select1-ns")
	b.ReportMetric(float64(raw.Nanoseconds())/n, "raw-ns")
	b.ReportMetric(float64(ours.Nanoseconds())/n, "sem-ns")
	b.ReportMetric(float64(raw)/float64(floor), "raw/select1")
	b.ReportMetric(float64(ours)/float64(floor), "sem/select1")
}

// BenchmarkSemaphoreParallel is TryAcquire(1) + Release from 32
// goroutines of one Locker on a semaphore of 32 (every goroutine can hold
// a permit), beside the raw pair from 32 goroutines on a pool of 32
// connections, each on a key of its own, interleaved in rounds of 200
// pairs per goroutine; pairs/s for each.
func BenchmarkSemaphoreParallel(b *testing.B) {
	const g, round = 32, 200
	l, _, _ := benchLocker(b, advisory.Config{})
	sem, err := l.Semaphore("bench", g)
	if err != nil {
		b.Fatal(err)
	}
	rawPool := pgtest.New(b).NewPool(b)
	ctx := context.Background()
	var rawT, semT time.Duration
	var pairs int
	for b.Loop() {
		rawT += parallel(b, g, round, func(i int) error {
			var ok bool
			if err := rawPool.QueryRow(ctx, "select pg_try_advisory_lock($1)", int64(i)).Scan(&ok); err != nil {
				return err
			}
			return rawPool.QueryRow(ctx, "select pg_advisory_unlock($1)", int64(i)).Scan(&ok)
		})
		semT += parallel(b, g, round, func(int) error {
			p, err := sem.TryAcquire(ctx, 1)
			if err != nil {
				return err
			}
			return p.Release(ctx)
		})
		pairs += g * round
	}
	b.ReportMetric(float64(pairs)/rawT.Seconds(), "raw-pairs/s")
	b.ReportMetric(float64(pairs)/semT.Seconds(), "sem-pairs/s")
	b.ReportMetric(rawT.Seconds()/semT.Seconds(), "sem/raw")
}

// parallel runs f round times on each of g goroutines and returns the
// wall time.
func parallel(b *testing.B, g, round int, f func(i int) error) time.Duration {
	start := time.Now()
	var wg sync.WaitGroup
	for i := range g {
		wg.Go(func() {
			for range round {
				if err := f(i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// BenchmarkLockAllVsTryLocks interleaves TryLockAll of 5 keys + Unlock
// (one round trip each way, the unlocks pipelined) with 5 TryLocks + 5
// Unlocks one after the other, and the floor (SELECT 1).
func BenchmarkLockAllVsTryLocks(b *testing.B) {
	l, _, _ := benchLocker(b, advisory.Config{})
	conn := pgtest.New(b).Conn(b)
	ctx := context.Background()
	keys := []pglocks.Key{pglocks.KeyOf("b1"), pglocks.KeyOf("b2"), pglocks.KeyOf("b3"), pglocks.KeyOf("b4"), pglocks.KeyOf("b5")}
	var floor, all, each time.Duration
	var one int
	for b.Loop() {
		t0 := time.Now()
		if err := conn.QueryRow(ctx, "select 1").Scan(&one); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		ls, err := l.TryLockAll(ctx, keys...)
		if err != nil {
			b.Fatal(err)
		}
		if err := ls.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		locks := make([]*advisory.Lock, 0, len(keys))
		for _, k := range keys {
			lk, err := l.TryLock(ctx, k)
			if err != nil {
				b.Fatal(err)
			}
			locks = append(locks, lk)
		}
		for _, lk := range locks {
			if err := lk.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
		t3 := time.Now()
		floor += t1.Sub(t0)
		all += t2.Sub(t1)
		each += t3.Sub(t2)
	}
	n := float64(b.N)
	b.ReportMetric(float64(floor.Nanoseconds())/n, "select1-ns")
	b.ReportMetric(float64(all.Nanoseconds())/n, "lockall5-ns")
	b.ReportMetric(float64(each.Nanoseconds())/n, "trylock5-ns")
	b.ReportMetric(float64(all)/float64(floor), "lockall5/select1")
	b.ReportMetric(float64(each)/float64(all), "trylock5/lockall5")
}
