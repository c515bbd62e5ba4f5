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
	"github.com/pglocks/pglocks/internal/engine"
	"github.com/pglocks/pglocks/internal/engine/enginetest"
	"github.com/pglocks/pglocks/pgtest"
)

// TestLocksThatDoNotExcludeAreRefused points a Locker at a database whose
// own advisory-lock functions return true and lock nothing, as
// CockroachDB's stubs do: without the engine probe two Lockers would both
// hold the key. TryLock and Lock fail at once with ErrLocksDoNotExclude
// (the failure confirmed on a fresh pair of connections), and keep failing
// without probing again.
func TestLocksThatDoNotExcludeAreRefused(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.New(t)
	enginetest.Lie(t, db, engine.SessionLocks)
	l, err := advisory.New(lazyPool(t, db.DSN), advisory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	key := pglocks.KeyOf("liar")
	for i := range 2 {
		if _, err := l.TryLock(ctx, key); !errors.Is(err, advisory.ErrLocksDoNotExclude) {
			t.Fatalf("TryLock %d: %v, want ErrLocksDoNotExclude", i, err)
		} else if i == 0 {
			t.Log(err)
		}
	}
	if _, err := l.Lock(ctx, key); !errors.Is(err, advisory.ErrLocksDoNotExclude) {
		t.Fatalf("Lock: %v, want ErrLocksDoNotExclude", err)
	}
}

// TestEngineProofCost measures what the proof adds to a Locker's first
// TryLock (one more connection, two identity reads and 26 statements,
// once) and checks that
// later TryLocks, on the Locker's open sessions, do not probe again.
func TestEngineProofCost(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.New(t)
	pool := lazyPool(t, db.DSN)
	const lockers = 5
	var first, later time.Duration
	for range lockers {
		l, err := advisory.New(pool, advisory.Config{})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		lk, err := l.TryLock(ctx, pglocks.KeyOf("cost"))
		if err != nil {
			t.Fatal(err)
		}
		first += time.Since(start)
		_ = lk.Unlock(ctx)
		start = time.Now()
		for range 100 {
			lk, err := l.TryLock(ctx, pglocks.KeyOf("cost"))
			if err != nil {
				t.Fatal(err)
			}
			_ = lk.Unlock(ctx)
		}
		later += time.Since(start) / 100
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A closed connection's backend leaves pg_stat_activity a moment after
	// the client closed it: wait for this database's probes to go.
	probes := -1
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(30 * time.Second); probes != 0 && time.Now().Before(deadline); <-tick.C {
		if err := db.Conn(t).QueryRow(ctx, "select count(*) from pg_catalog.pg_stat_activity where application_name = 'pglocks engine probe' and datname = pg_catalog.current_database()").Scan(&probes); err != nil {
			t.Fatal(err)
		}
	}
	if probes != 0 {
		t.Fatalf("%d probe connections left open", probes)
	}
	t.Logf("first TryLock of a new Locker (dial + engine proof): %v; TryLock+Unlock after: %v", first/lockers, later/lockers)
}

// TestEngineReprobedOnNewServer: a Locker proved on one server whose
// connections later reach another (a failover to another cluster; here
// another database, whose functions lie) probes that one again and
// refuses it, rather than trust the first proof.
func TestEngineReprobedOnNewServer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, liar := pgtest.New(t), pgtest.New(t)
	enginetest.Lie(t, liar, engine.SessionLocks)
	var flipped atomic.Bool
	pool := lazyPool(t, db.DSN, func(c *pgxpool.Config) {
		c.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
			if flipped.Load() {
				cc.Database = liar.Name
			}
			return nil
		}
	})
	l := newLocker(t, pool, advisory.Config{})
	key := pglocks.KeyOf("failover")
	lk, err := l.TryLock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	_ = lk.Unlock(ctx)
	flipped.Store(true)
	if _, err := db.Conn(t).Exec(ctx, "select pg_catalog.pg_terminate_backend(pid) from pg_catalog.pg_stat_activity where datname = pg_catalog.current_database() and pid <> pg_catalog.pg_backend_pid()"); err != nil {
		t.Fatal(err)
	}
	lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
	defer lcancel()
	if _, err := l.Lock(lctx, key); !errors.Is(err, advisory.ErrLocksDoNotExclude) {
		t.Fatalf("Lock on the new server: %v, want ErrLocksDoNotExclude", err)
	} else {
		t.Log(err)
	}
}
