package pgtest_test

import (
	"context"
	"testing"

	"github.com/pglocks/pglocks/pgtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.WrapMain(m)) }

func TestNewGivesFreshDatabase(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	conn := db.Conn(t)
	var name string
	if err := conn.QueryRow(context.Background(), "select current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	if name != db.Name {
		t.Fatalf("connected to %q, want %q", name, db.Name)
	}
}
