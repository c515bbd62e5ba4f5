package lease_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// TestListenerUsesPoolHooks: the store's listening connection is opened the
// way the pool opens its own, through BeforeConnect (where rotated
// credentials or IAM tokens come from) and AfterConnect, so a pool whose
// ConnConfig alone cannot log in still gets waiters woken by NOTIFY
// (it used to dial from ConnConfig and never listened).
func TestListenerUsesPoolHooks(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var after atomic.Int64
	wrong := strings.Replace(db.DSN, "postgres@", "no_such_role_lease@", 1)
	pool := pgtest.NewPool(t, wrong, func(c *pgxpool.Config) {
		c.MinConns = 0
		c.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
			cc.User = "postgres"
			return nil
		}
		c.AfterConnect = func(context.Context, *pgx.Conn) error {
			after.Add(1)
			return nil
		}
	})
	store := newStore(t, pool, lease.Config{})
	ctx := ctxT(t)
	holder, got := heldAndAwaited(t, store, "hooked")
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if l := <-got; l == nil {
		t.FailNow()
	}
	if after.Load() < 2 {
		t.Errorf("AfterConnect ran %d times; want the pool's and the listener's", after.Load())
	}
}
