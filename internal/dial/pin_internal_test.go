package dial

import (
	"context"
	"net"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestPinTo: a multi-host config is narrowed to the hosts that resolve to
// the pinned IP, at the pinned port; a single host, or a config none of
// whose hosts resolves to it, is left as it is.
func TestPinTo(t *testing.T) {
	pin := &net.TCPAddr{IP: net.ParseIP("127.0.0.2"), Port: 6000}
	for _, c := range []struct {
		dsn      string
		wantHost string
		wantPort uint16
		wantFall int
	}{
		{"postgres://u@127.0.0.1:5000,127.0.0.2:5001/db?sslmode=disable", "127.0.0.2", 6000, 0},
		{"postgres://u@127.0.0.2:5000,127.0.0.1:5001,127.0.0.2:5002/db?sslmode=disable", "127.0.0.2", 6000, 1},
		{"postgres://u@127.0.0.1:5000,127.0.0.2:5001/db?sslmode=prefer", "127.0.0.2", 6000, 1},  // TLS, then not
		{"postgres://u@127.0.0.1:5000,127.0.0.3:5001/db?sslmode=disable", "127.0.0.1", 5000, 1}, // none: as it is
		{"postgres://u@127.0.0.2:5000/db?sslmode=prefer", "127.0.0.2", 5000, 1},                 // one host: as it is
	} {
		cfg, err := pgx.ParseConfig(c.dsn)
		if err != nil {
			t.Fatal(err)
		}
		pinTo(context.Background(), cfg, pin)
		if cfg.Host != c.wantHost || cfg.Port != c.wantPort || len(cfg.Fallbacks) != c.wantFall {
			t.Errorf("%s: pinned to %s:%d with %d fallbacks, want %s:%d with %d", c.dsn, cfg.Host, cfg.Port, len(cfg.Fallbacks), c.wantHost, c.wantPort, c.wantFall)
		}
	}
}
