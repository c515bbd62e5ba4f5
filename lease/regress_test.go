package lease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// TestTokenRegressionDetected winds the fencing counter back by hand, as a
// failover to a standby that lacked recent commits does (TestFailoverAsync
// does it for real): the store that had seen the higher token refuses the
// regressed acquisition with a RegressionError, from TryAcquire and from
// Acquire alike, and raises the row's counter so that the next acquisition
// gets a token above everything it saw. A store that never saw the higher
// tokens cannot tell (documented).
func TestTokenRegressionDetected(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	var last int64
	for range 8 {
		l, err := b.store.TryAcquire(ctx, "job", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		last = l.Token()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	exec(t, b.pool, "update pglocks_leases set token = token - 2 where name = 'job'")

	_, err := b.store.TryAcquire(ctx, "job", time.Minute)
	var re *lease.RegressionError
	if !errors.As(err, &re) || !errors.Is(err, lease.ErrTokenRegressed) {
		t.Fatalf("TryAcquire after the counter went back: %v, want a RegressionError", err)
	}
	if re.Token != last-1 || re.Seen != last || re.Name != "job" {
		t.Fatalf("RegressionError %+v, want Token %d Seen %d", re, last-1, last)
	}
	t.Log(err)
	l, err := b.store.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatalf("the acquisition after a refused one: %v", err)
	}
	if l.Token() != last+1 {
		t.Fatalf("token %d after the counter was raised, want %d", l.Token(), last+1)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Acquire returns the refusal rather than retrying past it.
	exec(t, b.pool, "update pglocks_leases set token = token - 1 where name = 'job'")
	if _, err := b.store.Acquire(ctx, "job", time.Minute); !errors.As(err, &re) || re.Token != last+1 {
		t.Fatalf("Acquire after the counter went back: %v, want a RegressionError for token %d", err, last+1)
	}

	// A store that never saw the lost tokens accepts a regressed one.
	exec(t, b.pool, "update pglocks_leases set token = token - 5 where name = 'job'")
	fresh := newStore(t, b.pool, lease.Config{})
	l, err = fresh.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() > last {
		t.Fatalf("token %d: the counter did not go back", l.Token())
	}
	t.Logf("a fresh store accepted token %d again (it never saw %d)", l.Token(), last+1)
}

// TestHeldTokenIsSeen: a holder's token shown in a HeldError counts as seen.
func TestHeldTokenIsSeen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	other := newStore(t, b.pool, lease.Config{})
	var l *lease.Lease
	for i := range 3 { // tokens 1, 2, 3: the last one stays held
		var err error
		if l, err = other.TryAcquire(ctx, "job", time.Minute); err != nil {
			t.Fatal(err)
		}
		if i < 2 {
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := b.store.TryAcquire(ctx, "job", time.Minute); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("TryAcquire of a held lease: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	exec(t, b.pool, "update pglocks_leases set token = token - 1 where name = 'job'")
	if _, err := b.store.TryAcquire(ctx, "job", time.Minute); !errors.Is(err, lease.ErrTokenRegressed) {
		t.Fatalf("TryAcquire of token %d after seeing it held: %v, want ErrTokenRegressed", l.Token(), err)
	}
}
