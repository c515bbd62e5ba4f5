//go:build !linux

package pgtest

import (
	"context"
	"net"
)

// dial is Linux's; newNetLink refuses to make a link elsewhere.
func (l *netLink) dial(context.Context, string) (net.Conn, error) {
	return nil, errNoPartition
}

// inNetns is Linux's: network namespaces are.
func inNetns(string, func() error) error { return errNoPartition }
