package gooselock_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"testing/fstest"

	_ "github.com/jackc/pgx/v5/stdlib" // the driver the Locker needs
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/gooselock"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pressly/goose/v3"
)

// Every replica runs this at startup; one migrates, the others wait for it
// and find nothing left to do.
func Example() {
	ctx := context.Background()
	dsn, err := pgtest.ExampleDSN(ctx) // a throwaway database; use your own
	if err != nil {
		log.Fatal(err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	migrations := fstest.MapFS{ // an embed.FS in a real service
		"00001_users.sql": {Data: []byte("-- +goose Up\ncreate table users (id bigint primary key);\n")},
	}

	locker, err := gooselock.New(pglocks.KeyOf("goose:users-service"))
	if err != nil {
		log.Fatal(err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations, goose.WithSessionLocker(locker))
	if err != nil {
		log.Fatal(err)
	}
	results, err := provider.Up(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range results {
		fmt.Println("applied", r.Source.Path)
	}
	// Output: applied 00001_users.sql
}
