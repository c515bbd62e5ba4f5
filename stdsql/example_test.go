package stdsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // or lib/pq
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/stdsql"
)

// A service on database/sql fences its writes with a lease: they commit
// only while the lease is held.
func Example() {
	ctx := context.Background()
	dsn, err := pgtest.ExampleDSN(ctx) // a throwaway database; use your own
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn) // leases live on a pgx pool
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close(ctx)
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	db, err := sql.Open("pgx", dsn) // the service's own database/sql pool
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "create table ledger (entry text)"); err != nil {
		log.Fatal(err)
	}

	l, err := store.TryAcquire(ctx, "ledger-writer", time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if err := stdsql.Guard(ctx, tx, l); err != nil {
		log.Fatal(err) // not held: roll back
	}
	if _, err := tx.ExecContext(ctx, "insert into ledger values ('paid')"); err != nil {
		log.Fatal(err)
	}
	fmt.Println("commit:", tx.Commit())
	_ = l.Release(ctx)
	// Output: commit: <nil>
}
