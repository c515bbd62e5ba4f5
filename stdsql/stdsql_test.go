package stdsql_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx"
	_ "github.com/lib/pq"              // driver "postgres"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/stdsql"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pgtest.WrapMain(m), goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

var drivers = []string{"pgx", "postgres"} // pgx's stdlib, lib/pq

func open(t *testing.T, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func newStore(t *testing.T, pool *pgxpool.Pool) *lease.Store {
	t.Helper()
	s, err := lease.New(pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// TestGuard: writes in a database/sql transaction commit while the lease
// is held; once it is broken, Guard fails with ErrNotHeld.
func TestGuard(t *testing.T) {
	t.Parallel()
	for _, driver := range drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			pdb := pgtest.New(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			store := newStore(t, pdb.NewPool(t))
			if err := store.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			db := open(t, driver, pdb.DSN)
			if _, err := db.ExecContext(ctx, "create table items (n int)"); err != nil {
				t.Fatal(err)
			}
			l, err := store.TryAcquire(ctx, "writer", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			write := func(n int) error {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				if err := stdsql.Guard(ctx, tx, l); err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, "insert into items values ($1)", n); err != nil {
					return err
				}
				return tx.Commit()
			}
			if err := write(1); err != nil {
				t.Fatalf("guarded write while held: %v", err)
			}
			if _, err := store.Break(ctx, "writer"); err != nil {
				t.Fatal(err)
			}
			if err := write(2); !errors.Is(err, lease.ErrNotHeld) {
				t.Fatalf("guarded write after Break = %v, want ErrNotHeld", err)
			}
			var got []int
			rows, err := db.QueryContext(ctx, "select n from items order by n")
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var n int
				_ = rows.Scan(&n)
				got = append(got, n)
			}
			rows.Close()
			if len(got) != 1 || got[0] != 1 {
				t.Errorf("items = %v, want [1]: only the write under the lease commits", got)
			}
		})
	}
}

// TestXactLock: transaction-scoped locks through database/sql exclude each
// other and end with the transaction.
func TestXactLock(t *testing.T) {
	t.Parallel()
	for _, driver := range drivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := open(t, driver, pgtest.New(t).DSN)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			key := pglocks.KeyOf("stdsql")
			tx1, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx1.Rollback()
			if err := stdsql.XactLock(ctx, tx1, key); err != nil {
				t.Fatal(err)
			}
			tx2, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx2.Rollback()
			if err := stdsql.TryXactLock(ctx, tx2, key); !errors.Is(err, advisory.ErrLocked) {
				t.Fatalf("TryXactLock while tx1 holds = %v, want ErrLocked", err)
			}
			if err := tx1.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := stdsql.TryXactLock(ctx, tx2, key); err != nil {
				t.Fatalf("TryXactLock after tx1 committed = %v", err)
			}
			pair := pglocks.PairKey(1, 2)
			if err := stdsql.TryXactLock(ctx, tx2, pair); err != nil {
				t.Fatalf("pair key: %v", err)
			}
		})
	}
}

func TestNilInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if err := stdsql.Guard(ctx, nil, nil); err == nil {
		t.Error("Guard(nil tx) accepted")
	}
	if err := stdsql.XactLock(ctx, nil, pglocks.KeyOf("x")); err == nil {
		t.Error("XactLock(nil tx) accepted")
	}
	if stdsql.Tx(nil) != nil {
		t.Error("Tx(nil) is not nil")
	}
}
