package pgtest_test

import (
	"context"
	"fmt"
	"log"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

// A user's suite with its schema in SQL files (often an embed.FS): the
// template is migrated once per server; on a PGTEST_DSN server, every
// package's test binary and every later run reuse it, until a file changes.
func ExampleWithMigrator() {
	var m *testing.M            // TestMain's argument
	var migrations fstest.MapFS // an embed.FS with //go:embed migrations/*.sql
	pgtest.Main(m, pgtest.WithMigrator(pgtest.SQLFiles(migrations, "migrations/*.sql")))
	// Then in each test: db := pgtest.New(t): a database with the schema.
}

// SQLFiles outside a test: each database is a clone of the migrated
// template.
func ExampleSQLFiles() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	migrations := fstest.MapFS{
		"migrations/001_users.sql":  {Data: []byte("create table users (id int primary key, email text)")},
		"migrations/002_orders.sql": {Data: []byte("create table orders (id int, user_id int references users)")},
	}
	db, err := srv.CreateDatabase(ctx, pgtest.WithMigrator(pgtest.SQLFiles(migrations, "migrations/*.sql")))
	if err != nil {
		log.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "select count(*) from pg_tables where schemaname = 'public'").Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println(n, "tables")
	// Output: 2 tables
}

// NewTx: a transaction rolled back when the test ends, for tests that need
// no session of their own.
func ExampleNewTx() {
	var t *testing.T // a test's argument
	tx := pgtest.NewTx(t)
	_, _ = tx.Exec(t.Context(), "insert into users (email) values ('a@example.com')")
	// Nothing of it outlives the test.
}
