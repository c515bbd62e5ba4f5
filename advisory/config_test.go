package advisory_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks/advisory"
)

// TestConfigLowerBounds: every interval of Config has a lower bound; a
// smaller non-zero value (1ns: a busy loop) is refused by New with an
// error naming the field and the bound, and the bounds themselves are
// accepted. New opens no connection, so the pool points nowhere.
func TestConfigLowerBounds(t *testing.T) {
	t.Parallel()
	pool := lazyPool(t, "postgres://nobody@"+closedAddr(t)+"/none?sslmode=disable")
	for _, tc := range []struct {
		name string
		cfg  advisory.Config
		want string
	}{
		{"PingInterval", advisory.Config{PingInterval: time.Nanosecond}, "PingInterval must be at least 10ms, got 1ns"},
		{"PingIntervalBelow", advisory.Config{PingInterval: 10*time.Millisecond - time.Microsecond}, "PingInterval must be at least 10ms"},
		{"QueryTimeout", advisory.Config{QueryTimeout: time.Nanosecond}, "QueryTimeout must be at least 10ms, got 1ns"},
		{"MinBackoff", advisory.Config{MinBackoff: time.Nanosecond}, "MinBackoff must be at least 1ms, got 1ns"},
		{"MaxBackoff", advisory.Config{MinBackoff: time.Millisecond, MaxBackoff: time.Nanosecond}, "MaxBackoff must be at least 10ms, got 1ns"},
		{"MaxBackoffBelow", advisory.Config{MinBackoff: time.Millisecond, MaxBackoff: 9 * time.Millisecond}, "MaxBackoff must be at least 10ms"},
		{"KeepalivesIdle", advisory.Config{KeepalivesIdle: time.Nanosecond}, "KeepalivesIdle must be whole seconds"},
		{"KeepalivesInterval", advisory.Config{KeepalivesInterval: time.Nanosecond}, "KeepalivesInterval must be whole seconds"},
		{"TCPUserTimeout", advisory.Config{TCPUserTimeout: time.Nanosecond}, "must be less than TCPUserTimeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := advisory.New(pool, tc.cfg)
			if err == nil {
				_ = l.Close(context.Background())
				t.Fatalf("New(%+v) accepted it", tc.cfg)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error saying %q", err, tc.want)
			}
		})
	}
	t.Run("AtTheBounds", func(t *testing.T) {
		l, err := advisory.New(pool, advisory.Config{
			PingInterval: 10 * time.Millisecond, QueryTimeout: 10 * time.Millisecond,
			MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}
