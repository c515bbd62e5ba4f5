package leader_test

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// TestIntervalLowerBounds: every interval of Config has a lower bound; a
// smaller value (1ns: a busy loop) is refused by New with ErrInvalidConfig
// naming the field and the bound, in every mode, and the bounds themselves
// are accepted.
func TestIntervalLowerBounds(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t).NewPool(t)
	for _, mode := range []leader.Mode{leader.ModeSession, leader.ModeLeaseOnly} {
		for _, tc := range []struct {
			name string
			cfg  leader.Config
			want string
		}{
			{"RenewInterval", leader.Config{RenewInterval: time.Nanosecond}, "RenewInterval 1ns is below the minimum of 10ms"},
			{"RenewIntervalBelow", leader.Config{RenewInterval: 10*time.Millisecond - time.Microsecond}, "RenewInterval 9.999ms is below the minimum of 10ms"},
			{"RetryInterval", leader.Config{RetryInterval: time.Nanosecond}, "RetryInterval 1ns is below the minimum of 10ms"},
			{"RetryIntervalBelow", leader.Config{RetryInterval: 10*time.Millisecond - time.Microsecond}, "RetryInterval 9.999ms is below the minimum of 10ms"},
			{"TTL", leader.Config{TTL: time.Nanosecond}, "TTL 1ns is below the minimum of 100ms"},
		} {
			t.Run(mode.String()+"/"+tc.name, func(t *testing.T) {
				tc.cfg.Name, tc.cfg.Pool, tc.cfg.Mode = "bounds", pool, mode
				e, err := leader.New(tc.cfg)
				if err == nil {
					_ = e.Close(t.Context())
					t.Fatalf("New(%+v) accepted it", tc.cfg)
				}
				if !errors.Is(err, leader.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("New: %v, want ErrInvalidConfig saying %q", err, tc.want)
				}
			})
		}
		t.Run(mode.String()+"/AtTheBounds", func(t *testing.T) {
			ttl := 100 * time.Millisecond
			if mode == leader.ModeSession {
				ttl = time.Second // above the default Grace (600ms), which a session needs
			}
			e, err := leader.New(leader.Config{Name: "bounds", Pool: pool, Mode: mode, TTL: ttl,
				RenewInterval: 10 * time.Millisecond, RetryInterval: 10 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Close(t.Context()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestTTLMinimumIsTheLeases: leader.MinTTL is lease.MinTTL — one lower
// bound for a TTL across both packages — and a TTL just below it is
// refused by New, naming the bound.
func TestTTLMinimumIsTheLeases(t *testing.T) {
	t.Parallel()
	if leader.MinTTL != lease.MinTTL {
		t.Errorf("leader.MinTTL = %v, lease.MinTTL = %v: want one bound", leader.MinTTL, lease.MinTTL)
	}
	pool := pgtest.New(t).NewPool(t)
	_, err := leader.New(leader.Config{Name: "x", Pool: pool, Mode: leader.ModeLeaseOnly, TTL: lease.MinTTL - time.Microsecond})
	if !errors.Is(err, leader.ErrInvalidConfig) || !strings.Contains(err.Error(), "below the minimum of "+lease.MinTTL.String()) {
		t.Errorf("New with TTL below lease.MinTTL: %v", err)
	}
}

// TestRenewCadence: a term is renewed at its Store's keep-alive cadence. A
// Store the elector makes itself renews a lease of TTL every
// RenewInterval; a given Store's cadence (TTL × its RenewFraction) wins,
// Config reports it as RenewInterval and an explicit RenewInterval that
// differs is logged at Warn; a given Store whose cadence is below the
// minimum is refused, naming it.
func TestRenewCadence(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t).NewPool(t)
	own, err := leader.New(leader.Config{Name: "cadence", Pool: pool, Mode: leader.ModeLeaseOnly,
		TTL: 2 * time.Second, RenewInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close(t.Context())
	if got := time.Duration(float64(2*time.Second) * own.Config().Store.Config().RenewFraction); got < 100*time.Millisecond || got > 100*time.Millisecond+time.Microsecond {
		t.Errorf("own Store renews a 2s lease every %v, want RenewInterval 100ms", got)
	}
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close(t.Context())
	var logged strings.Builder
	given, err := leader.New(leader.Config{Name: "cadence", Pool: pool, Store: store, Mode: leader.ModeLeaseOnly,
		TTL: 3 * time.Second, RenewInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer given.Close(t.Context())
	if got := given.Config().RenewInterval; got < time.Second-time.Microsecond || got > time.Second {
		t.Errorf("RenewInterval with a given Store = %v, want its cadence TTL/3 = 1s", got)
	}
	if !strings.Contains(logged.String(), "RenewInterval is not used") {
		t.Errorf("no warning that the explicit RenewInterval is not used; logged: %s", logged.String())
	}
	fast, err := lease.New(pool, lease.Config{RenewFraction: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Close(t.Context())
	_, err = leader.New(leader.Config{Name: "cadence", Pool: pool, Store: fast, Mode: leader.ModeLeaseOnly, TTL: 500 * time.Millisecond})
	if !errors.Is(err, leader.ErrInvalidConfig) || !strings.Contains(err.Error(), "keep-alive would renew every 5ms") {
		t.Errorf("New with a Store renewing every 5ms: %v, want ErrInvalidConfig naming the cadence", err)
	}
}
