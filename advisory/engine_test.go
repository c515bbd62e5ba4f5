package advisory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/internal/engine"
	"github.com/pglocks/pglocks/internal/engine/enginetest"
	"github.com/pglocks/pglocks/pgtest"
)

// TestLocksThatDoNotExcludeAreRefused points a Locker at a database whose
// search_path shadows the advisory-lock functions with ones that return
// true and lock nothing, as CockroachDB's stubs do: without the engine
// probe two Lockers would both hold the key. TryLock and Lock fail at once
// with ErrLocksDoNotExclude, and keep failing without probing again.
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
// TryLock (one more connection and four statements, once) and checks that
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
	var probes int
	if err := db.Conn(t).QueryRow(ctx, "select count(*) from pg_stat_activity where application_name = 'pglocks engine probe'").Scan(&probes); err != nil {
		t.Fatal(err)
	}
	if probes != 0 {
		t.Fatalf("%d probe connections left open", probes)
	}
	t.Logf("first TryLock of a new Locker (dial + engine proof): %v; TryLock+Unlock after: %v", first/lockers, later/lockers)
}
