package nilsafe_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/stdsql"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pgtest.WrapMain(m), goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

// TestGuardsInRealTransactions: the guards of a nil
// Lease, a zero Lease and the zero Term, called with a live transaction —
// of pgx and of database/sql (stdsql) — return an error and do not panic;
// the zero Term's wraps lease.ErrNotHeld.
func TestGuardsInRealTransactions(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := db.NewPool(t)
	sdb, err := sql.Open("pgx", db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sdb.Close() })
	guards := map[string]func(pgx.Tx, *sql.Tx) error{
		"(*lease.Lease)(nil).Guard": func(tx pgx.Tx, _ *sql.Tx) error { return (*lease.Lease)(nil).Guard(ctx, tx) },
		"new(lease.Lease).Guard":    func(tx pgx.Tx, _ *sql.Tx) error { return new(lease.Lease).Guard(ctx, tx) },
		"leader.Term{}.Guard":       func(tx pgx.Tx, _ *sql.Tx) error { return leader.Term{}.Guard(ctx, tx) },
		"stdsql.GuardTerm(Term{})":  func(_ pgx.Tx, stx *sql.Tx) error { return stdsql.GuardTerm(ctx, stx, leader.Term{}) },
		"stdsql.Guard(nil lease)":   func(_ pgx.Tx, stx *sql.Tx) error { return stdsql.Guard(ctx, stx, nil) },
	}
	for name, guard := range guards {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("%s: panic: %v", name, p)
				}
			}()
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			stx, err := sdb.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer stx.Rollback()
			err = guard(tx, stx)
			t.Logf("%s: %v", name, err)
			if err == nil {
				t.Errorf("%s: no error", name)
			}
			if name == "leader.Term{}.Guard" && !errors.Is(err, lease.ErrNotHeld) {
				t.Errorf("%s = %v, want an error wrapping lease.ErrNotHeld", name, err)
			}
		}()
	}
}
