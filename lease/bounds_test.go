package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// TestIntervalLowerBounds: the store's intervals have lower bounds, so no
// setting makes a busy loop: Config.CheckInterval at least 1ms (refused by
// New), and a kept-alive lease's renewal interval, TTL ×
// Config.RenewFraction, at least 10ms — at most 100 renewals a second per
// lease, as advisory's pings and leader's renewals (refused by TryAcquire
// and Do with ErrInvalidTTL naming RenewFraction and the bound; a
// RenewFraction of 1e-12 made it 0 — a renewal every round — before, and
// a bound of 100µs allowed 10,000 commits a second per lease). The bound
// itself is accepted.
func TestIntervalLowerBounds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	if _, err := lease.New(b.pool, lease.Config{CheckInterval: time.Nanosecond}); !errors.Is(err, lease.ErrInvalidConfig) ||
		!strings.Contains(err.Error(), "Config.CheckInterval 1ns is below 1ms") {
		t.Errorf("CheckInterval 1ns: %v, want ErrInvalidConfig naming the field and 1ms", err)
	}
	s := newStore(t, b.pool, lease.Config{RenewFraction: 1e-12})
	want := "TTL × Config.RenewFraction (0s) is below the minimum of 10ms"
	if _, err := s.TryAcquire(ctx, "tiny-renew", time.Second, lease.WithKeepAlive()); !errors.Is(err, lease.ErrInvalidTTL) ||
		!strings.Contains(err.Error(), want) {
		t.Errorf("TryAcquire with keep-alive every 1ps: %v, want ErrInvalidTTL saying %q", err, want)
	}
	ran := false
	err := s.Do(ctx, "tiny-renew", time.Second, func(context.Context) error { ran = true; return nil })
	if !errors.Is(err, lease.ErrInvalidTTL) || !strings.Contains(err.Error(), want) || ran {
		t.Errorf("Do with keep-alive every 1ps: %v (fn ran: %v), want ErrInvalidTTL saying %q", err, ran, want)
	}
	// Without keep-alive nothing renews on a schedule: the fraction is unused.
	l := mustTry(t, s, "tiny-renew", time.Second)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Below the bound: renewed every 200µs (TTL 100ms × 0.002).
	below := newStore(t, b.pool, lease.Config{RenewFraction: 0.002})
	if _, err := below.TryAcquire(ctx, "below-bound", lease.MinTTL, lease.WithKeepAlive()); !errors.Is(err, lease.ErrInvalidTTL) ||
		!strings.Contains(err.Error(), "(200µs) is below the minimum of 10ms") {
		t.Errorf("TryAcquire with keep-alive every 200µs: %v, want ErrInvalidTTL saying 200µs is below 10ms", err)
	}
	// At the bound: renewed every 10ms (TTL 1s × 0.01).
	at := newStore(t, b.pool, lease.Config{RenewFraction: 0.01})
	l = mustTry(t, at, "at-bound", time.Second, lease.WithKeepAlive())
	if err := l.Release(ctx); err != nil && !errors.Is(err, lease.ErrNotHeld) {
		t.Fatal(err)
	}
}

// TestTTLLowerBound: a TTL below lease.MinTTL (100ms, the bound leader
// has too) is refused with ErrInvalidTTL naming the bound, by every call
// that takes a TTL, and by New for Config.MaxTTL; MinTTL itself is
// accepted. A 1 ms lease used to be accepted, and was lost before its
// holder could use it.
func TestTTLLowerBound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	if lease.MinTTL != 100*time.Millisecond {
		t.Errorf("lease.MinTTL = %v, want 100ms", lease.MinTTL)
	}
	want := "below the minimum of 100ms"
	for _, ttl := range []time.Duration{time.Millisecond, lease.MinTTL - time.Microsecond} {
		calls := map[string]func() error{
			"TryAcquire": func() error { _, err := b.store.TryAcquire(ctx, "tiny", ttl); return err },
			"Acquire":    func() error { _, err := b.store.Acquire(ctx, "tiny", ttl); return err },
			"Do": func() error {
				return b.store.Do(ctx, "tiny", ttl, func(context.Context) error { return nil })
			},
		}
		for name, call := range calls {
			if err := call(); !errors.Is(err, lease.ErrInvalidTTL) || !strings.Contains(err.Error(), want) {
				t.Errorf("%s with TTL %v: %v, want ErrInvalidTTL saying %q", name, ttl, err, want)
			}
		}
	}
	if _, err := lease.New(b.pool, lease.Config{MaxTTL: lease.MinTTL - time.Microsecond}); !errors.Is(err, lease.ErrInvalidConfig) {
		t.Errorf("New with MaxTTL below MinTTL: %v, want ErrInvalidConfig", err)
	}
	l := mustTry(t, b.store, "at-min", lease.MinTTL)
	if err := l.Release(ctx); err != nil && !errors.Is(err, lease.ErrNotHeld) {
		t.Fatal(err)
	}
}
