package pgtestmigrate_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/pgtest/pgtestmigrate"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func files(token, second string) fstest.MapFS {
	return fstest.MapFS{
		"db/1_users.up.sql":    {Data: []byte("-- " + token + "\ncreate table users (id int primary key);\n")},
		"db/1_users.down.sql":  {Data: []byte("drop table users;\n")},
		"db/2_orders.up.sql":   {Data: []byte(second + "\n")},
		"db/2_orders.down.sql": {Data: []byte("drop table orders;\n")},
	}
}

// TestMigrate proves that golang-migrate's migrations make the template,
// and that a failing one names its file.
func TestMigrate(t *testing.T) {
	token := pgtest.RandomToken()
	db := pgtest.New(t, pgtest.WithMigrator(pgtestmigrate.New(files(token, "create table orders (id int);"), "db")))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var n int
	if err := db.Conn(t).QueryRow(ctx, "select count(*) from pg_tables where tablename in ('users', 'orders')").Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d of the 2 tables (%v)", n, err)
	}
	_, err := db.Server.CreateDatabase(ctx, pgtest.WithMigrator(pgtestmigrate.New(files(token, "create table (;"), "db")))
	if err == nil || !strings.Contains(err.Error(), "db/2_orders.up.sql") {
		t.Fatalf("err = %v, want one naming db/2_orders.up.sql", err)
	}
	if _, err := db.Server.CreateDatabase(ctx, pgtest.WithMigrator(pgtestmigrate.New(nil, "db"))); err == nil {
		t.Fatal("nil file system: no error")
	}
}

// A database migrated by golang-migrate, outside a test.
func ExampleNew() {
	ctx := context.Background()
	srv, err := pgtest.Start(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	migrations := fstest.MapFS{"db/1_users.up.sql": {Data: []byte("create table users (id int);")}}
	db, err := srv.CreateDatabase(ctx, pgtest.WithMigrator(pgtestmigrate.New(migrations, "db")))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(db.Name != "")
	// Output: true
}
