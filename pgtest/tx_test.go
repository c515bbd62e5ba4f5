package pgtest_test

import (
	"testing"
	"time"

	"github.com/pglocks/pglocks/pgtest"
)

// TestNewTx proves that each NewTx test sees only its own work, and that
// nothing of it, nor its session advisory locks, outlives the test.
func TestNewTx(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"A", "B", "C"} {
		t.Run(name, func(t *testing.T) {
			var key int64 = 7
			t.Run("Inner", func(t *testing.T) {
				tx := pgtest.NewTx(t)
				ctx := ctxT(t, 30*time.Second)
				if _, err := tx.Exec(ctx, "create table t (x int); insert into t values (1)"); err != nil {
					t.Fatal(err)
				}
				if _, err := tx.Exec(ctx, "select pg_advisory_lock($1)", key); err != nil {
					t.Fatal(err)
				}
			})
			tx := pgtest.NewTx(t)
			ctx := ctxT(t, 30*time.Second)
			var n int
			if err := tx.QueryRow(ctx, "select count(*) from pg_tables where tablename = 't'").Scan(&n); err != nil || n != 0 {
				t.Fatalf("another test's table is visible: %d (%v)", n, err)
			}
			var free bool
			if err := tx.QueryRow(ctx, "select pg_try_advisory_lock($1)", key).Scan(&free); err != nil || !free {
				t.Fatalf("a finished test's session lock is still held (%v)", err)
			}
		})
	}
}
