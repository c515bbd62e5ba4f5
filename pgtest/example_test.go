package pgtest_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"testing"
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

// A package's TestMain that runs its tests on a PostgreSQL container:
// pgtest.Main(m) alone does that whenever a Docker engine answers, with the
// image PGTEST_IMAGE names (default postgres:16-alpine); WithImage fixes
// the image in code instead. With PGTEST_DSN set the tests use that server;
// with PGTEST_DOCKER=0, or no engine, local PostgreSQL binaries.
func ExampleMain_docker() {
	var m *testing.M // TestMain's argument
	pgtest.Main(m, pgtest.WithImage("postgres:16-alpine"))
}

// StartCluster runs a primary with a synchronous standby; Promote fails
// over, and the cluster's multi-host DSN follows the new primary.
func ExampleStartCluster() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := pgtest.StartCluster(ctx, pgtest.WithSynchronousStandby())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	db, err := c.CreateDatabase(ctx)
	if err != nil {
		log.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, db.DSN) // host=…,… port=…,… target_session_attrs=read-write
	if err != nil {
		log.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "create table t as select 42 as x"); err != nil {
		log.Fatal(err)
	}
	conn.Close(ctx)

	if _, err := c.Promote(ctx); err != nil { // the primary is gone
		log.Fatal(err)
	}
	conn, err = pgx.Connect(ctx, db.DSN) // the same DSN reaches the new primary
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	var x int
	if err := conn.QueryRow(ctx, "select x from t").Scan(&x); err != nil {
		log.Fatal(err)
	}
	fmt.Println("after failover x =", x)
	// Output: after failover x = 42
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
