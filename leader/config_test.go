package leader_test

import (
	"errors"
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
