package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/outcome"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// storeCalls are the store's operations, each made once: every one that
// sends a statement on the lease table.
func storeCalls(s *lease.Store) map[string]func(context.Context) error {
	return map[string]func(context.Context) error{
		"TryAcquire": func(ctx context.Context) error { _, err := s.TryAcquire(ctx, "setup", time.Minute); return err },
		"Acquire":    func(ctx context.Context) error { _, err := s.Acquire(ctx, "setup", time.Minute); return err },
		"Do": func(ctx context.Context) error {
			return s.Do(ctx, "setup", time.Minute, func(context.Context) error { return nil })
		},
		"Get":    func(ctx context.Context) error { _, err := s.Get(ctx, "setup"); return err },
		"List":   func(ctx context.Context) error { _, err := s.List(ctx); return err },
		"IsHeld": func(ctx context.Context) error { _, err := s.IsHeld(ctx, "setup"); return err },
		"Break":  func(ctx context.Context) error { _, err := s.Break(ctx, "setup"); return err },
	}
}

// wantSetupError fails the test unless err wraps sentinel, is classified
// Fatal, wraps the server's error with SQLSTATE code, and says every one
// of words.
func wantSetupError(t *testing.T, what string, err, sentinel error, code string, words ...string) {
	t.Helper()
	switch {
	case !errors.Is(err, sentinel):
		t.Errorf("%s: %v, want an error wrapping %q", what, err, sentinel)
	case outcome.SQLState(err) != code:
		t.Errorf("%s: %v, want the server's error (SQLSTATE %s) wrapped", what, err, code)
	case outcome.Of(err) != outcome.Fatal:
		t.Errorf("%s: %v classified %v, want fatal", what, err, outcome.Of(err))
	}
	if err == nil {
		return
	}
	if what == "TryAcquire" || what == "Migrate" {
		t.Logf("%s: %v", what, err)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %v\nwant it to say %q", what, err, w)
		}
	}
}

// TestNoTableNamesTheFix: every call on a database without the lease
// table fails at once with an error wrapping ErrNoTable that names the
// table and the three ways to create it, classified fatal; so do the
// calls of a lease whose table was dropped under it, Guard in the
// caller's transaction included.
func TestNoTableNamesTheFix(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pool := poolFor(t, db)
	exec(t, pool, "drop table pglocks_leases")
	ctx := ctxT(t)
	words := []string{`"public"."pglocks_leases"`, "Store.Migrate", "lease.SchemaSQL", "pglocks migrate"}
	s := newStore(t, pool, lease.Config{})
	for name, call := range storeCalls(s) {
		start := time.Now()
		err := call(ctx)
		wantSetupError(t, name, err, lease.ErrNoTable, "42P01", words...)
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("%s took %v, want it to fail at once", name, took)
		}
	}
	other := newStore(t, pool, lease.Config{Schema: "elsewhere", Table: "leases"})
	_, err := other.TryAcquire(ctx, "setup", time.Minute)
	wantSetupError(t, "TryAcquire, another table", err, lease.ErrNoTable, "42P01", `"elsewhere"."leases"`, "Store.Migrate")

	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	l := mustTry(t, s, "setup", time.Minute)
	exec(t, pool, "drop table pglocks_leases")
	wantSetupError(t, "Renew", l.Renew(ctx), lease.ErrNoTable, "42P01", words...)
	wantSetupError(t, "Assert", l.Assert(ctx, time.Second), lease.ErrNoTable, "42P01", words...)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return l.Guard(ctx, tx) })
	wantSetupError(t, "Guard", err, lease.ErrNoTable, "42P01", words...)
}

// limitedRole makes a login role with the given grants (statements with
// %s for the role) and returns a pool that connects as it.
func limitedRole(t *testing.T, db *pgtest.DB, admin *pgxpool.Pool, grants ...string) (string, *pgxpool.Pool) {
	t.Helper()
	role := "lease_setup_" + strings.ReplaceAll(db.Name, "pgtest_", "")
	ident := pgx.Identifier{role}.Sanitize()
	exec(t, admin, "create role "+ident+" login")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, sql := range []string{"drop owned by " + ident, "drop role " + ident} {
			if _, err := admin.Exec(ctx, sql); err != nil {
				t.Error(err)
			}
		}
	})
	for _, g := range grants {
		exec(t, admin, strings.ReplaceAll(g, "%s", ident))
	}
	cfg, err := pgxpool.ParseConfig(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return role, pool
}

// TestNoPrivilegeNamesTheGrant: a role that may not use the lease table
// gets an error wrapping ErrNoPrivilege that names the role, the table
// and the GRANT that cures it, classified fatal: with no privilege at all,
// with SELECT only (reads work, writes fail), and without USAGE on the
// table's schema.
func TestNoPrivilegeNamesTheGrant(t *testing.T) {
	t.Parallel()
	t.Run("None", func(t *testing.T) {
		t.Parallel()
		ctx := ctxT(t) // here: a parallel subtest may start long after its parent
		db := pgtest.New(t)
		role, pool := limitedRole(t, db, poolFor(t, db))
		grant := `grant select, insert, update on "public"."pglocks_leases" to "` + role + `"`
		for name, call := range storeCalls(newStore(t, pool, lease.Config{})) {
			wantSetupError(t, name, call(ctx), lease.ErrNoPrivilege, "42501", grant)
		}
	})
	t.Run("SelectOnly", func(t *testing.T) {
		t.Parallel()
		ctx := ctxT(t) // here: a parallel subtest may start long after its parent
		db := pgtest.New(t)
		role, pool := limitedRole(t, db, poolFor(t, db), "grant select on pglocks_leases to %s")
		s := newStore(t, pool, lease.Config{})
		if _, err := s.List(ctx); err != nil {
			t.Fatalf("List with SELECT: %v", err)
		}
		_, err := s.TryAcquire(ctx, "setup", time.Minute)
		wantSetupError(t, "TryAcquire", err, lease.ErrNoPrivilege, "42501",
			`grant select, insert, update on "public"."pglocks_leases" to "`+role+`"`)
	})
	t.Run("NoSchemaUsage", func(t *testing.T) {
		t.Parallel()
		ctx := ctxT(t) // here: a parallel subtest may start long after its parent
		db := pgtest.New(t)
		admin := poolFor(t, db)
		if err := newStore(t, admin, lease.Config{Schema: "locks"}).Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		role, pool := limitedRole(t, db, admin, "grant select, insert, update on locks.pglocks_leases to %s")
		_, err := newStore(t, pool, lease.Config{Schema: "locks"}).TryAcquire(ctx, "setup", time.Minute)
		wantSetupError(t, "TryAcquire", err, lease.ErrNoPrivilege, "42501", `grant usage on schema "locks" to "`+role+`"`)
	})
	t.Run("Migrate", func(t *testing.T) {
		t.Parallel()
		ctx := ctxT(t) // here: a parallel subtest may start long after its parent
		db := pgtest.New(t)
		admin := poolFor(t, db)
		exec(t, admin, "drop table pglocks_leases")
		role, pool := limitedRole(t, db, admin)
		err := newStore(t, pool, lease.Config{}).Migrate(ctx)
		wantSetupError(t, "Migrate", err, lease.ErrNoPrivilege, "42501", `grant create on schema "public" to "`+role+`"`)
		err = newStore(t, pool, lease.Config{Schema: "fresh"}).Migrate(ctx)
		wantSetupError(t, "Migrate", err, lease.ErrNoPrivilege, "42501", `may create schema "fresh"`,
			`grant create on database "`+db.Name+`" to "`+role+`"`)
	})
}

// TestReadOnlyNamesThePrimary: a store whose pool reaches a read-only
// server — a database with default_transaction_read_only on, and a real
// standby — gets an error wrapping ErrReadOnly that says to point the pool
// at the primary, classified fatal, from every call that writes; reads
// work.
func TestReadOnlyNamesThePrimary(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, pool *pgxpool.Pool) {
		ctx := ctxT(t)
		s := newStore(t, pool, lease.Config{})
		if _, err := s.List(ctx); err != nil {
			t.Fatalf("List on a read-only server: %v", err)
		}
		for name, call := range storeCalls(s) {
			switch name {
			case "Get", "List", "IsHeld":
				continue
			}
			wantSetupError(t, name, call(ctx), lease.ErrReadOnly, "25006", "read-only", "primary", "target_session_attrs=read-write")
		}
	}
	t.Run("DefaultReadOnly", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		exec(t, poolFor(t, db), "alter database "+pgx.Identifier{db.Name}.Sanitize()+" set default_transaction_read_only = on")
		check(t, db.NewPool(t))
	})
	t.Run("Standby", func(t *testing.T) {
		t.Parallel()
		ctx := ctxT(t) // here: a parallel subtest may start long after its parent
		c := pgtest.NewCluster(t, pgtest.WithTemplate(func(ctx context.Context, conn *pgx.Conn) error {
			ddl, err := lease.SchemaSQL(lease.Config{})
			if err == nil {
				_, err = conn.Exec(ctx, ddl)
			}
			return err
		}))
		db := c.NewDB(t)
		if err := c.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		check(t, pgtest.NewPool(t, c.StandbyDSN(db.Name)))
	})
}
