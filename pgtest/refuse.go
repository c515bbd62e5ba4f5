package pgtest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Refuser makes a pool's new connections fail as a server that is down or
// restarting makes them fail: while [Refuser.Refuse] is on, every dial of
// the pools it is installed in is refused by the kernel (ECONNREFUSED,
// from a Unix socket that nobody listens on), so pgx reports a
// *pgconn.ConnectError and nothing reaches the server; connections already
// open are untouched (end them with [DB.TerminateApplication] or
// [Server.TerminateBackend], and pgxpool.Pool.Reset, to make the pool
// dial). [Refuser.Allow] lets dials through again.
type Refuser struct {
	refusing atomic.Bool
	refused  atomic.Int64
	path     string
}

// NewRefuser returns a Refuser that lets dials through until Refuse. Its
// socket file is removed when the test ends.
func NewRefuser(t testing.TB) *Refuser {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgtest-refuse") // short: a socket path has ~100 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	path := filepath.Join(dir, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false) // keep the file: connecting to it is then refused
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return &Refuser{path: path}
}

// Install makes cfg's dials go through r; use it as a configure function of
// [DB.NewPool]. Connections made from cfg.ConnConfig elsewhere (a
// dedicated listening connection opened "the way the pool does") go
// through r too.
func (r *Refuser) Install(cfg *pgxpool.Config) {
	next := cfg.ConnConfig.DialFunc
	if next == nil {
		next = (&net.Dialer{}).DialContext
	}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if r.refusing.Load() {
			r.refused.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, "unix", r.path)
		}
		return next(ctx, network, addr)
	}
}

// Refuse makes every later dial fail with "connection refused".
func (r *Refuser) Refuse() { r.refusing.Store(true) }

// Allow lets dials through again.
func (r *Refuser) Allow() { r.refusing.Store(false) }

// Refused returns how many dials r has refused so far.
func (r *Refuser) Refused() int64 { return r.refused.Load() }
