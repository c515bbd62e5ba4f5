package singleflight_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/singleflight"
)

// BenchmarkStore compares a store fenced by the lock (Table.PutHeld, its
// statement reads pg_locks) with a plain Put and with the floor, one
// SELECT 1 round trip on the same pool.
func BenchmarkStore(b *testing.B) {
	db := pgtest.New(b)
	ctx := context.Background()
	pool := db.NewPool(b)
	table, err := singleflight.NewTable(pool, "", "")
	if err != nil {
		b.Fatal(err)
	}
	if err := table.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	g := &singleflight.Group{Results: table}
	g.Locker = newBenchLocker(b, pool)
	lk, err := g.Locker.Lock(ctx, pglocks.KeyOf("bench"))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = lk.Unlock(ctx) }()
	value := []byte("a result")
	b.Run("SelectOne", func(b *testing.B) {
		for b.Loop() {
			if _, err := pool.Exec(ctx, "select 1"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Put", func(b *testing.B) {
		for b.Loop() {
			if err := table.Put(ctx, "bench", value, time.Minute); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("PutHeld", func(b *testing.B) {
		for b.Loop() {
			if err := table.PutHeld(ctx, lk, "bench", value, time.Minute); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func newBenchLocker(b *testing.B, pool *pgxpool.Pool) *advisory.Locker {
	b.Helper()
	l, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}
