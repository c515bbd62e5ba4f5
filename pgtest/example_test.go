package pgtest_test

import (
	"context"
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
