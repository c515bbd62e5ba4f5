package advisory_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// shadowExec runs stmts on db as its owner.
func shadowExec(t *testing.T, db *pgtest.DB, stmts ...string) {
	t.Helper()
	c := db.Conn(t)
	for _, s := range stmts {
		if _, err := c.Exec(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// bothHold takes a key on two Lockers of db, first then second:
// exclusion holds iff the second is refused (or the first is refused with
// ErrLocksDoNotExclude by the engine probe).
func bothHold(t *testing.T, db *pgtest.DB, first, second func(context.Context, *advisory.Locker) (*advisory.Lock, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l1 := newLocker(t, lazyPool(t, db.DSN), advisory.Config{})
	l2 := newLocker(t, lazyPool(t, db.DSN), advisory.Config{})
	a, err := first(ctx, l1)
	if err != nil {
		if errors.Is(err, advisory.ErrLocksDoNotExclude) {
			t.Logf("first: %v (the probe refused)", err)
			return
		}
		t.Fatal(err)
	}
	b, err := second(ctx, l2)
	if err == nil {
		t.Fatalf("two Lockers hold the same key at once (%v, %v)", a, b)
	}
	t.Logf("second: %v", err)
}

func tryLock(k pglocks.Key) func(context.Context, *advisory.Locker) (*advisory.Lock, error) {
	return func(ctx context.Context, l *advisory.Locker) (*advisory.Lock, error) { return l.TryLock(ctx, k) }
}

func tryRLock(k pglocks.Key) func(context.Context, *advisory.Locker) (*advisory.Lock, error) {
	return func(ctx context.Context, l *advisory.Locker) (*advisory.Lock, error) { return l.TryRLock(ctx, k) }
}

// TestShadowedSharedFormsOnly: a schema before pg_catalog shadows only the
// shared functions. A writer and a reader must not hold the key together.
func TestShadowedSharedFormsOnly(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	shadowExec(t, db, "create schema liar",
		"create function liar.pg_try_advisory_lock_shared(bigint) returns boolean language sql as 'select true'",
		"create function liar.pg_advisory_unlock_shared(bigint) returns boolean language sql as 'select true'",
		"alter database "+pgx.Identifier{db.Name}.Sanitize()+" set search_path = liar, pg_catalog, public")
	k := pglocks.KeyOf("shared-liar")
	bothHold(t, db, tryLock(k), tryRLock(k))
}

// TestShadowedPairFormsOnly: a schema before pg_catalog shadows only the
// (int4, int4) forms.
func TestShadowedPairFormsOnly(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	shadowExec(t, db, "create schema liar",
		"create function liar.pg_try_advisory_lock(int, int) returns boolean language sql as 'select true'",
		"create function liar.pg_advisory_unlock(int, int) returns boolean language sql as 'select true'",
		"alter database "+pgx.Identifier{db.Name}.Sanitize()+" set search_path = liar, pg_catalog, public")
	k := pglocks.PairKey(1, 2)
	bothHold(t, db, tryLock(k), tryLock(k))
}

// TestFloat8OverloadInPublic: no search_path change, an overload in public
// taking float8. A statement prepared with an untyped $1 resolves to it
// (float8 is the numeric category's preferred type); the Locker's types
// its parameters and qualifies pg_catalog, so it never does.
func TestFloat8OverloadInPublic(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	shadowExec(t, db,
		"create function public.pg_try_advisory_lock(float8) returns boolean language sql as 'select true'",
		"create function public.pg_advisory_unlock(float8) returns boolean language sql as 'select true'")
	k := pglocks.KeyOf("float8")
	bothHold(t, db, tryLock(k), tryLock(k))
}

// TestMisroutedProbeConnection: the probe's second connection lands once
// on another database (a DNS or load-balancer flip between the Locker's
// dial and the probe's). That is no verdict: the Locker must not refuse
// for good, and a later TryLock succeeds.
func TestMisroutedProbeConnection(t *testing.T) {
	t.Parallel()
	db, other := pgtest.New(t), pgtest.New(t)
	otherCfg, err := pgxpool.ParseConfig(other.DSN)
	if err != nil {
		t.Fatal(err)
	}
	var dials atomic.Int32
	pool := lazyPool(t, db.DSN, func(c *pgxpool.Config) {
		c.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
			if dials.Add(1) == 2 { // the 2nd dial is the probe's second session
				cc.Database = otherCfg.ConnConfig.Database
			}
			return nil
		}
	})
	l := newLocker(t, pool, advisory.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = l.TryLock(ctx, pglocks.KeyOf("x"))
	t.Logf("TryLock: %v", err)
	if errors.Is(err, advisory.ErrLocksDoNotExclude) {
		t.Fatalf("one misrouted probe connection refused the Locker: %v", err)
	}
	if err == nil {
		t.Fatal("TryLock succeeded through a misrouted probe connection")
	}
	// Lock waits through the failed dial's pacing and dials again.
	lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
	defer lcancel()
	lk, err := l.Lock(lctx, pglocks.KeyOf("x"))
	if err != nil {
		t.Fatalf("Lock after the misrouted probe: %v", err)
	}
	_ = lk.Unlock(ctx)
}
