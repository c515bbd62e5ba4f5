package lease_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
)

// TestLeastPrivilege: a role with only SELECT, INSERT and UPDATE on the
// lease table does everything but Migrate.
func TestLeastPrivilege(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	role := "lease_app_" + hex.EncodeToString(suffix)
	ident := pgx.Identifier{role}.Sanitize()
	exec(t, b.pool, "create role "+ident+" login")
	t.Cleanup(func() {
		// Roles are cluster-wide: drop it, after its grants in this database.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, sql := range []string{"drop owned by " + ident, "drop role " + ident} {
			if _, err := b.pool.Exec(ctx, sql); err != nil {
				t.Error(err)
			}
		}
	})
	exec(t, b.pool, "grant select, insert, update on pglocks_leases to "+ident)

	cfg, err := pgxpool.ParseConfig(b.db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := newStore(t, pool, lease.Config{})

	if err := s.Migrate(ctx); err == nil {
		t.Error("Migrate succeeded without the CREATE privilege")
	}
	l := mustTry(t, s, "app", time.Minute, lease.WithKeepAlive())
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Assert(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return l.Guard(ctx, tx) }); err != nil {
		t.Fatal(err)
	}
	// Another store, so that the resume statement runs (this store would
	// renew its own live Lease).
	if _, err := newStore(t, pool, lease.Config{}).Resume(ctx, l.Handle()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.List(ctx); err != nil {
		t.Fatal(err)
	}
	waiter := make(chan error, 1)
	go func() {
		w, err := s.Acquire(ctx, "app", time.Minute) // LISTEN
		if err == nil {
			err = w.Release(ctx)
		}
		waiter <- err
	}()
	waitWaiting(t, bundle{store: s}, "app")
	if err := l.Release(ctx); err != nil { // NOTIFY
		t.Fatal(err)
	}
	if err := <-waiter; err != nil {
		t.Fatal(err)
	}
	if _, err := s.Break(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if err := s.Do(ctx, "app", time.Minute, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "delete from pglocks_leases"); err == nil {
		t.Error("the role can delete lease rows; the test grants too much")
	}
	var pgErr interface{ SQLState() string }
	if err := s.Migrate(ctx); !errors.As(err, &pgErr) || pgErr.SQLState() != "42501" {
		t.Errorf("Migrate: %v, want insufficient_privilege", err)
	}
}
