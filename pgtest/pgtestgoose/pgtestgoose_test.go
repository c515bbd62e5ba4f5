package pgtestgoose_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/pgtest/pgtestgoose"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func files(token, second string) fstest.MapFS {
	return fstest.MapFS{
		"00001_users.sql":  {Data: []byte("-- +goose Up\n-- " + token + "\ncreate table users (id int primary key);\n")},
		"00002_orders.sql": {Data: []byte("-- +goose Up\n" + second + "\n")},
	}
}

func tables(t *testing.T, db *pgtest.DB) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := db.Conn(t).Query(ctx, "select tablename from pg_tables where schemaname = 'public' order by 1")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		_ = rows.Scan(&n)
		names = append(names, n)
	}
	return names
}

// TestGoose proves that goose's migrations make the template, and that a
// failing one names its file.
func TestGoose(t *testing.T) {
	token := pgtest.RandomToken()
	db := pgtest.New(t, pgtest.WithMigrator(pgtestgoose.New(files(token, "create table orders (id int);"))))
	if got := strings.Join(tables(t, db), ","); got != "goose_db_version,orders,users" {
		t.Fatalf("tables %s", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := db.Server.CreateDatabase(ctx, pgtest.WithMigrator(pgtestgoose.New(files(token, "create table (;"))))
	if err == nil || !strings.Contains(err.Error(), "00002_orders.sql") {
		t.Fatalf("err = %v, want one naming 00002_orders.sql", err)
	}
	if _, err := db.Server.CreateDatabase(ctx, pgtest.WithMigrator(pgtestgoose.New(nil))); err == nil {
		t.Fatal("nil file system: no error")
	}
}

// A database migrated by goose, outside a test.
func ExampleNew() {
	ctx := context.Background()
	srv, err := pgtest.Start(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	migrations := fstest.MapFS{"00001_users.sql": {Data: []byte("-- +goose Up\ncreate table users (id int);\n")}}
	db, err := srv.CreateDatabase(ctx, pgtest.WithMigrator(pgtestgoose.New(migrations)))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(db.Name != "")
	// Output: true
}
