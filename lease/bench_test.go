package lease_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// benchSetup makes a database, a pool of maxConns connections and a Store
// on it. pgtest's servers run with fsync off, so a commit's WAL flush is a
// write without a disk sync there: with LEASE_BENCH_FSYNC=on the database
// is on a server of its own with fsync on (full_page_writes still off), in
// $TMPDIR: a flush reaches the disk there, unless $TMPDIR is a tmpfs.
func benchSetup(b *testing.B, maxConns int32) (*pgtest.DB, *pgxpool.Pool, *lease.Store) {
	b.Helper()
	var db *pgtest.DB
	if v := os.Getenv("LEASE_BENCH_FSYNC"); v != "" {
		db = pgtest.NewServer(b, pgtest.WithSetting("fsync", v)).NewDB(b)
	} else {
		db = pgtest.New(b)
	}
	pool := db.NewPool(b, func(c *pgxpool.Config) { c.MaxConns = maxConns; c.MinConns = maxConns })
	s := newStore(b, pool, lease.Config{})
	if err := s.Migrate(context.Background()); err != nil { // a private server has no template
		b.Fatal(err)
	}
	return db, pool, s
}

// BenchmarkPair compares one TryAcquire + Release with the physical floor
// (SELECT 1) and with the raw two-statement durable SQL pair a hand-written
// lease would run, both on one connection.
func BenchmarkPair(b *testing.B) {
	ctx := context.Background()
	b.Run("Select1", func(b *testing.B) {
		db, _, _ := benchSetup(b, 1)
		conn := db.Conn(b)
		for b.Loop() {
			if _, err := conn.Exec(ctx, "select 1"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("RawSQLPair", func(b *testing.B) {
		db, _, s := benchSetup(b, 1)
		conn := db.Conn(b)
		l, err := s.TryAcquire(ctx, "bench", time.Minute) // create the row
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		owner := uuid.New()
		for b.Loop() {
			if err := rawPair(ctx, conn, "bench", owner); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("TryAcquireRelease", func(b *testing.B) {
		_, _, s := benchSetup(b, 1)
		for b.Loop() {
			l, err := s.TryAcquire(ctx, "bench", time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkFailedTry is the cost of a try that finds the lease held, beside
// the naive INSERT … ON CONFLICT DO UPDATE … WHERE, which locks the row.
func BenchmarkFailedTry(b *testing.B) {
	ctx := context.Background()
	b.Run("TryAcquire", func(b *testing.B) {
		_, _, s := benchSetup(b, 1)
		if _, err := s.TryAcquire(ctx, "busy", time.Hour); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := s.TryAcquire(ctx, "busy", time.Hour); !errors.Is(err, lease.ErrHeld) {
				b.Fatal(err)
			}
		}
	})
	b.Run("NaiveUpsert", func(b *testing.B) {
		db, _, s := benchSetup(b, 1)
		if _, err := s.TryAcquire(ctx, "busy", time.Hour); err != nil {
			b.Fatal(err)
		}
		conn := db.Conn(b)
		for b.Loop() {
			tag, err := conn.Exec(ctx, `insert into pglocks_leases as l (name, owner, token, ttl, acquired_at, renewed_at, expires_at)
				values ($1, $2, 1, '1 hour', now(), now(), now() + interval '1 hour')
				on conflict (name) do update set owner = excluded.owner, token = l.token + 1, expires_at = excluded.expires_at
				where l.owner is null or l.expires_at <= now()`, "busy", uuid.New())
			if err != nil || tag.RowsAffected() != 0 {
				b.Fatal(tag, err)
			}
		}
	})
}

// BenchmarkThroughput runs TryAcquire + Release from 8, 16, 32 and 64 clients,
// each on a name of its own (Distinct) or all on one name (Hot, where most
// tries fail), and for reference the raw SQL pair on distinct names
// (RawDistinct), and that pair with a release that does not wait for its
// WAL flush, as ours does (RawDistinctLazy). pairs/s counts successful
// acquire+release pairs.
func BenchmarkThroughput(b *testing.B) {
	for _, clients := range []int{8, 16, 32, 64} {
		b.Run(fmt.Sprintf("RawDistinct/clients=%d", clients), func(b *testing.B) { rawThroughput(b, clients, rawPair) })
		b.Run(fmt.Sprintf("RawDistinctLazy/clients=%d", clients), func(b *testing.B) { rawThroughput(b, clients, rawPairLazy) })
		b.Run(fmt.Sprintf("Distinct/clients=%d", clients), func(b *testing.B) { oursThroughput(b, clients, false) })
		b.Run(fmt.Sprintf("Hot/clients=%d", clients), func(b *testing.B) { oursThroughput(b, clients, true) })
	}
}

// rawThroughput runs pair from clients goroutines, each on a name of its
// own.
func rawThroughput(b *testing.B, clients int, pair func(context.Context, rawDB, string, uuid.UUID) error) {
	ctx := context.Background()
	_, pool, s := benchSetup(b, int32(clients))
	warm(b, pool, s, clients)
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	b.ResetTimer()
	start := time.Now()
	for c := range clients {
		name, owner := "n"+strconv.Itoa(c), uuid.New()
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := pair(ctx, pool, name, owner); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pairs/s")
}

// oursThroughput runs TryAcquire + Release from clients goroutines, each on
// a name of its own, or all on one (hot).
func oursThroughput(b *testing.B, clients int, hot bool) {
	ctx := context.Background()
	_, pool, s := benchSetup(b, int32(clients))
	warm(b, pool, s, clients)
	var (
		next, pairs atomic.Int64
		wg          sync.WaitGroup
	)
	b.ResetTimer()
	start := time.Now()
	for c := range clients {
		name := "n" + strconv.Itoa(c)
		if hot {
			name = "hot"
		}
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				l, err := s.TryAcquire(ctx, name, time.Minute)
				if errors.Is(err, lease.ErrHeld) {
					continue
				}
				if err != nil {
					b.Error(err)
					return
				}
				if err := l.Release(ctx); err != nil {
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
}

// warm readies a throughput run, so that ours and raw start alike: it
// creates the rows of names n0…n{clients-1} (and starts the store's
// listener) with a TryAcquire + Release each, and waits until the pool has
// opened all its connections, which pgxpool opens in the background.
func warm(b *testing.B, pool *pgxpool.Pool, s *lease.Store, clients int) {
	b.Helper()
	ctx := context.Background()
	for c := range clients {
		l, err := s.TryAcquire(ctx, "n"+strconv.Itoa(c), time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	eventually(b, time.Minute, "the pool's connections", func() bool { return pool.Stat().TotalConns() >= int32(clients) })
}

// BenchmarkWakeup measures the time from Release to the waiting Acquire
// holding the lease: two goroutines hand one lease back and forth.
func BenchmarkWakeup(b *testing.B) {
	ctx := context.Background()
	_, _, s := benchSetup(b, 4)
	var lat []time.Duration
	held, err := s.TryAcquire(ctx, "ping", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		got := make(chan *lease.Lease)
		go func() {
			l, err := s.Acquire(ctx, "ping", time.Hour)
			if err != nil {
				b.Error(err)
			}
			got <- l
		}()
		waitParked(b, s)
		start := time.Now()
		if err := held.Release(ctx); err != nil {
			b.Fatal(err)
		}
		held = <-got
		if held == nil {
			b.FailNow()
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(q(0.5), "p50-µs")
	b.ReportMetric(q(0.9), "p90-µs")
	b.ReportMetric(q(0.99), "p99-µs")
}

// rawPair is the hand-written durable lease pair: a conditional UPDATE to
// acquire, another to release, each its own transaction.
func rawPair(ctx context.Context, db rawDB, name string, owner uuid.UUID) error {
	return rawPairRelease(ctx, db, name, owner, rawRelease)
}

// rawPairLazy is rawPair with a release that does not wait for its WAL
// flush, as ours does: the pair a user who knew that trick would write.
func rawPairLazy(ctx context.Context, db rawDB, name string, owner uuid.UUID) error {
	return rawPairRelease(ctx, db, name, owner, rawRelease+" returning set_config('synchronous_commit', 'off', true)")
}

const rawRelease = `update pglocks_leases set owner = null, expires_at = now()
		where name = $1 and owner = $2 and token = $3`

type rawDB interface {
	QueryRow(context.Context, string, ...any) pgx.Row
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}

func rawPairRelease(ctx context.Context, db rawDB, name string, owner uuid.UUID, release string) error {
	var token int64
	err := db.QueryRow(ctx, `update pglocks_leases set owner = $2, token = token + 1,
		expires_at = now() + interval '1 minute', renewed_at = now(), acquired_at = now()
		where name = $1 and (owner is null or expires_at <= now()) returning token`, name, owner).Scan(&token)
	if err != nil {
		return err
	}
	_, err = db.Exec(ctx, release, name, owner, token)
	return err
}

// BenchmarkVsFloor runs SELECT 1, the raw two-statement SQL pair, that
// pair with a release that does not wait for its WAL flush (as ours) and
// TryAcquire + Release alternately in every iteration, so that a noisy
// machine slows all four alike, and reports their ratios.
func BenchmarkVsFloor(b *testing.B) {
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
	owner := uuid.New()
	var floor, raw, lazy, ours time.Duration
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
		if err := rawPairLazy(ctx, conn, "raw", owner); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		l, err := s.TryAcquire(ctx, "ours", time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		t4 := time.Now()
		floor += t1.Sub(t0)
		raw += t2.Sub(t1)
		lazy += t3.Sub(t2)
		ours += t4.Sub(t3)
	}
	n := float64(b.N)
	b.ReportMetric(float64(floor.Nanoseconds())/n, "select1-ns")
	b.ReportMetric(float64(raw.Nanoseconds())/n, "rawpair-ns")
	b.ReportMetric(float64(lazy.Nanoseconds())/n, "rawlazy-ns")
	b.ReportMetric(float64(ours.Nanoseconds())/n, "acquire+release-ns")
	b.ReportMetric(float64(ours)/float64(raw), "ours/rawpair")
	b.ReportMetric(float64(ours)/float64(lazy), "ours/rawlazy")
	b.ReportMetric(float64(ours)/float64(floor), "ours/select1")
}
