// Package routetest lets a test move where a pgx pool dials its new
// connections: the connections dialled before a move stay where they
// were (on a proxy the test then silences, say), later ones go to the new
// address. It guarantees nothing about connections already open.
package routetest

import (
	"context"
	"net"
	"sync/atomic"
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
