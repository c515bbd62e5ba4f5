// Package routetest lets a test move where a pgx pool dials its new
// connections: the connections dialled before a move stay where they
// were (on a proxy the test then silences, say), later ones go to the new
// address. It guarantees nothing about connections already open. Its
// Impatient dialer gives up on a peer gone silent within seconds.
package routetest

import (
	"context"
	"errors"
	"net"
	"net/url"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Route is the TCP address a pool's dials go to. Its Dial is a pgx
// DialFunc; Move changes the address for the dials that follow.
type Route struct{ addr atomic.Pointer[string] }

// To returns a Route to addr, host:port.
func To(addr string) *Route {
	r := &Route{}
	r.Move(addr)
	return r
}

// Move sends the dials that follow to addr, host:port.
func (r *Route) Move(addr string) { r.addr.Store(&addr) }

// Dial dials the Route's address over TCP, whatever network and address
// pgx asks for.
func (r *Route) Dial(ctx context.Context, _, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", *r.addr.Load())
}

// Impatient returns a dialer whose connections give up on a peer gone
// silent within seconds, with ETIMEDOUT, instead of the kernel's minutes:
// keepalives every second (3 probes), and TCP_USER_TIMEOUT userTimeout for
// data sent and not acknowledged.
func Impatient(userTimeout time.Duration) *net.Dialer {
	return &net.Dialer{
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: time.Second, Interval: time.Second, Count: 3},
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(userTimeout/time.Millisecond))
			})
			return errors.Join(err, serr)
		},
	}
}

// FirstHost returns dsn, a URL, with addr listed before its hosts and the
// query parameters of set set (connect_timeout, say). It fails t on a dsn
// that is no URL.
func FirstHost(t testing.TB, dsn, addr string, set map[string]string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr + "," + u.Host
	q := u.Query()
	for k, v := range set {
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	return u.String()
}
