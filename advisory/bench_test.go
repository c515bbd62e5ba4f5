package advisory_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// benchLocker returns a locker on a fresh database, its pool, and the
// application name its sessions use.
func benchLocker(b *testing.B, cfg advisory.Config) (*advisory.Locker, *pgxpool.Pool, string) {
	b.Helper()
	bb := setup(b, cfg)
	return bb.locker, bb.pool, bb.app
}

// BenchmarkSelect1 is the physical floor: one round trip on one pinned
// connection, through pgx as an application would send it.
func BenchmarkSelect1(b *testing.B) {
	db := pgtest.New(b)
	conn := db.Conn(b)
	ctx := context.Background()
	var one int
	for b.Loop() {
		if err := conn.QueryRow(ctx, "select 1").Scan(&one); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRawTryUnlock is pg_try_advisory_lock + pg_advisory_unlock in
// plain SQL on one pinned connection: what TryLock+Unlock costs at best.
func BenchmarkRawTryUnlock(b *testing.B) {
	db := pgtest.New(b)
	conn := db.Conn(b)
	ctx := context.Background()
	var ok bool
	for b.Loop() {
		if err := conn.QueryRow(ctx, "select pg_try_advisory_lock($1)", int64(42)).Scan(&ok); err != nil || !ok {
			b.Fatal(err, ok)
		}
		if err := conn.QueryRow(ctx, "select pg_advisory_unlock($1)", int64(42)).Scan(&ok); err != nil || !ok {
			b.Fatal(err, ok)
		}
	}
}

// BenchmarkTryLockUnlock is Locker.TryLock + Lock.Unlock, one goroutine.
func BenchmarkTryLockUnlock(b *testing.B) {
	l, _, _ := benchLocker(b, advisory.Config{})
	ctx := context.Background()
	key := pglocks.KeyOf("bench")
	for b.Loop() {
		lk, err := l.TryLock(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVsFloor interleaves, in every iteration, the floor (SELECT 1
// on a pinned connection), raw pg_try_advisory_lock + pg_advisory_unlock on
// that connection, and TryLock+Unlock, so that a noisy machine slows all
// three alike; it reports each one's time and the ratios to the floor.
func BenchmarkVsFloor(b *testing.B) {
	l, _, _ := benchLocker(b, advisory.Config{})
	conn := pgtest.New(b).Conn(b)
	ctx := context.Background()
	key := pglocks.KeyOf("bench")
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
		lk, err := l.TryLock(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
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
	b.ReportMetric(float64(ours.Nanoseconds())/n, "trylock+unlock-ns")
	b.ReportMetric(float64(raw)/float64(floor), "raw/select1")
	b.ReportMetric(float64(ours)/float64(floor), "ours/select1")
}

// BenchmarkTryThroughput compares, at 8, 32 and 64 goroutines each on a
// key of its own, TryLock+Unlock (Try; Try8 on a Locker of up to 8
// sessions rather than the default 3) with the raw pair a user would
// write instead (Raw): pg_try_advisory_lock and pg_advisory_unlock on a
// connection taken from a pool of as many connections as goroutines. The
// two are sub-benchmarks side by side: run them with -count and compare
// them with benchstat; pairs/s is pairs per second.
func BenchmarkTryThroughput(b *testing.B) {
	for _, g := range []int{8, 32, 64} {
		// Try8 is a Locker with MaxSessions 8 rather than the default 3.
		for _, kind := range []string{"Raw", "Try", "Try8"} {
			raw := kind == "Raw"
			cfg := advisory.Config{}
			if kind == "Try8" {
				cfg.MaxSessions = 8
			}
			b.Run(fmt.Sprintf("%s/G%d", kind, g), func(b *testing.B) {
				l, _, _ := benchLocker(b, cfg)
				var pool *pgxpool.Pool
				if raw {
					pool = pgtest.New(b).NewPool(b, func(c *pgxpool.Config) { c.MaxConns, c.MinConns = int32(g), int32(g) })
					// pgxpool opens its connections in the background: not
					// while the clock runs.
					waitFor(b, "the pool's connections", time.Minute, func() bool { return pool.Stat().TotalConns() >= int32(g) })
				}
				pair := func(ctx context.Context, i int) error {
					if raw {
						return rawTryUnlock(ctx, pool, int64(i))
					}
					lk, err := l.TryLock(ctx, pglocks.Int64Key(int64(i)))
					if err != nil {
						return err
					}
					return lk.Unlock(ctx)
				}
				if err := pair(context.Background(), 0); err != nil { // open the locker's session
					b.Fatal(err)
				}
				b.ReportMetric(float64(b.N)/runPairs(b, g, pair).Seconds(), "pairs/s")
			})
		}
	}
}

// runPairs runs b.N calls of pair from g goroutines, goroutine i passing
// i, and returns how long they took.
func runPairs(b *testing.B, g int, pair func(context.Context, int) error) time.Duration {
	ctx := context.Background()
	work := make(chan struct{}, 1024)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for i := range g {
		wg.Go(func() {
			for range work {
				if err := pair(ctx, i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	for range b.N {
		work <- struct{}{}
	}
	close(work)
	wg.Wait()
	return time.Since(start)
}

// rawTryUnlock is pg_try_advisory_lock and pg_advisory_unlock of key on
// one connection of pool, as a hand-written session lock runs them.
func rawTryUnlock(ctx context.Context, pool *pgxpool.Pool, key int64) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	var ok bool
	if err := c.QueryRow(ctx, "select pg_try_advisory_lock($1)", key).Scan(&ok); err != nil || !ok {
		return fmt.Errorf("raw try: %v %w", ok, err)
	}
	if err := c.QueryRow(ctx, "select pg_advisory_unlock($1)", key).Scan(&ok); err != nil || !ok {
		return fmt.Errorf("raw unlock: %v %w", ok, err)
	}
	return nil
}

// BenchmarkThroughput runs Lock+Unlock from many goroutines, on distinct
// keys and on one hot key; acq/s is acquisitions per second.
func BenchmarkThroughput(b *testing.B) {
	for _, keys := range []string{"Distinct", "Hot"} {
		for _, g := range []int{8, 32, 64} {
			b.Run(fmt.Sprintf("%s/G%d", keys, g), func(b *testing.B) {
				l, _, _ := benchLocker(b, advisory.Config{})
				runPairs(b, g, func(ctx context.Context, i int) error {
					key := pglocks.KeyOf("hot")
					if keys == "Distinct" {
						key = pglocks.Int64Key(int64(i))
					}
					lk, err := l.Lock(ctx, key)
					if err != nil {
						return err
					}
					return lk.Unlock(ctx)
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "acq/s")
			})
		}
	}
}

// BenchmarkHeldLocks takes b.N locks and holds them all, then reports the
// Go heap per held lock and the server connections the locker uses.
func BenchmarkHeldLocks(b *testing.B) {
	l, pool, app := benchLocker(b, advisory.Config{})
	ctx := context.Background()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	locks := make([]*advisory.Lock, 0, b.N)
	i := 0
	for b.Loop() {
		lk, err := l.TryLock(ctx, pglocks.Int64Key(int64(i)))
		if err != nil {
			b.Fatal(err)
		}
		locks = append(locks, lk)
		i++
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	var conns int
	if err := pool.QueryRow(ctx, "select count(*) from pg_stat_activity where application_name = $1", app).Scan(&conns); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(len(locks)), "heapB/lock")
	b.ReportMetric(float64(conns), "conns")
	for _, lk := range locks {
		if err := lk.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
