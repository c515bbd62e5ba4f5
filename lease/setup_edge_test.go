package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/internal/outcome"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// notSetup fails the test if err is explained as a store that is not set
// up, and unless it still carries the server's error with SQLSTATE code.
func notSetup(t *testing.T, what string, err error, code string) {
	t.Helper()
	t.Logf("%s: %v", what, err)
	for _, s := range []error{lease.ErrNoTable, lease.ErrNoPrivilege, lease.ErrReadOnly} {
		if errors.Is(err, s) {
			t.Errorf("%s: %v\nexplained as %q, but the server's error is not about the store's setup", what, err, s)
		}
	}
	if outcome.SQLState(err) != code {
		t.Errorf("%s: %v, want the server's error (SQLSTATE %s)", what, err, code)
	}
}

// TestSetupErrorsNameTheirObject: only an error about the store's own table
// or schema, raised by the store's statement itself, is explained as a
// store that is not set up; the GRANT names only what is missing.
func TestSetupErrorsNameTheirObject(t *testing.T) {
	t.Parallel()
	t.Run("TriggerOnMissingTable", func(t *testing.T) {
		t.Parallel()
		ctx := ctxT(t) // its own: a parallel subtest may start after the parent's would end
		db := pgtest.New(t)
		pool := poolFor(t, db)
		exec(t, pool, `create function audit() returns trigger language plpgsql as $$
			begin insert into no_such_audit values (new.name); return new; end $$`)
		exec(t, pool, "create trigger audit before insert or update on pglocks_leases for each row execute function audit()")
		_, err := newStore(t, pool, lease.Config{}).TryAcquire(ctx, "setup", time.Minute)
		notSetup(t, "TryAcquire", err, "42P01")
	})
	t.Run("TriggerRaisesPrivilege", func(t *testing.T) {
		t.Parallel()
		ctx := ctxT(t) // its own: a parallel subtest may start after the parent's would end
		db := pgtest.New(t)
		pool := poolFor(t, db)
		exec(t, pool, `create function deny() returns trigger language plpgsql as $$
			begin raise exception 'permission denied for table pglocks_leases' using errcode = '42501'; end $$`)
		exec(t, pool, "create trigger deny before insert or update on pglocks_leases for each row execute function deny()")
		_, err := newStore(t, pool, lease.Config{}).TryAcquire(ctx, "setup", time.Minute)
		notSetup(t, "TryAcquire", err, "42501")
	})
	t.Run("NotifyRevoked", func(t *testing.T) {
		t.Parallel()
		ctx := ctxT(t) // its own: a parallel subtest may start after the parent's would end
		db := pgtest.New(t)
		admin := poolFor(t, db)
		_, pool := limitedRole(t, db, admin, "grant select, insert, update on pglocks_leases to %s")
		exec(t, admin, "revoke execute on function pg_notify(text, text) from public")
		s := newStore(t, pool, lease.Config{})
		l, err := s.TryAcquire(ctx, "setup", time.Minute)
		if err == nil {
			err = l.Release(ctx)
		}
		notSetup(t, "TryAcquire and Release", err, "42501")
	})
	t.Run("TableNamedSchema", func(t *testing.T) {
		t.Parallel()
		ctx := ctxT(t) // its own: a parallel subtest may start after the parent's would end
		db := pgtest.New(t)
		admin := poolFor(t, db)
		cfg := lease.Config{Table: "schema_leases"}
		if err := newStore(t, admin, cfg).Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		_, pool := limitedRole(t, db, admin)
		_, err := newStore(t, pool, cfg).TryAcquire(ctx, "setup", time.Minute)
		wantSetupError(t, "TryAcquire", err, lease.ErrNoPrivilege, "42501", `on "public"."schema_leases"`)
		if err != nil && strings.Contains(err.Error(), "grant usage on schema") {
			t.Errorf("TryAcquire: %v\nasks for USAGE on the schema, which the role has", err)
		}
	})
}

// TestGuardSpeaksOfTheTransaction: Guard runs in the caller's transaction,
// so its errors speak of that transaction: of its role, not the store
// pool's, when it may not use the table; of a read-only transaction, not
// of pointing the pool at the primary, inside BEGIN READ ONLY.
func TestGuardSpeaksOfTheTransaction(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := pgtest.New(t)
	admin := poolFor(t, db)
	l := mustTry(t, newStore(t, admin, lease.Config{}), "guard", time.Minute)
	role, other := limitedRole(t, db, admin)
	err := pgx.BeginFunc(ctx, other, func(tx pgx.Tx) error { return l.Guard(ctx, tx) })
	t.Logf("Guard, another role: %v", err)
	wantSetupError(t, "Guard, another role", err, lease.ErrNoPrivilege, "42501", `to "`+role+`"`, "transaction")
	if err != nil && strings.Contains(err.Error(), `"postgres"`) {
		t.Errorf("Guard, another role: %v\nnames the store pool's role, not the transaction's", err)
	}
	exec(t, admin, "grant select, update on pglocks_leases to "+pgx.Identifier{role}.Sanitize()) // the GRANT it named
	if err := pgx.BeginFunc(ctx, other, func(tx pgx.Tx) error { return l.Guard(ctx, tx) }); err != nil {
		t.Errorf("Guard after the GRANT it named: %v", err)
	}
	err = pgx.BeginTxFunc(ctx, admin, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error { return l.Guard(ctx, tx) })
	t.Logf("Guard, read-only transaction: %v", err)
	wantSetupError(t, "Guard, read-only transaction", err, lease.ErrReadOnly, "25006", "read-only transaction", "read-write")
	if err != nil && strings.Contains(err.Error(), "point the pool") {
		t.Errorf("Guard, read-only transaction: %v\nsays to point the pool at the primary, which it is", err)
	}
}

// TestMigrateReadOnlyNamesThePrimary: Migrate on a read-only database
// wraps ErrReadOnly and says what to do, like every other call.
func TestMigrateReadOnlyNamesThePrimary(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	exec(t, poolFor(t, db), "alter database "+pgx.Identifier{db.Name}.Sanitize()+" set default_transaction_read_only = on")
	err := newStore(t, db.NewPool(t), lease.Config{Schema: "fresh"}).Migrate(context.Background())
	wantSetupError(t, "Migrate", err, lease.ErrReadOnly, "25006", "read-only", "primary")
}
