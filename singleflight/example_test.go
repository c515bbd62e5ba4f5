package singleflight_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/singleflight"
)

// An expensive report is computed once and reused for ten minutes by every
// replica.
func Example() {
	ctx := context.Background()
	dsn, err := pgtest.ExampleDSN(ctx) // a throwaway database; use your own
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(ctx)
	table, err := singleflight.NewTable(pool, "", "")
	if err != nil {
		log.Fatal(err)
	}
	if err := table.Migrate(ctx); err != nil { // once, at deploy time
		log.Fatal(err)
	}
	g := &singleflight.Group{Locker: locker, Results: table, TTL: 10 * time.Minute}

	report := func(ctx context.Context) ([]byte, error) { return []byte("revenue: 42"), nil }
	for range 2 {
		v, from, err := g.Do(ctx, "report:2026-11", report)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s (%v)\n", v, from)
	}
	// Output:
	// revenue: 42 (computed)
	// revenue: 42 (hit)
}
