package pgtest

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// errNoTCP is returned when a server is reached through a Unix socket,
// which a TCP proxy cannot stand in front of.
var errNoTCP = errors.New("pgtest: server is not reached over TCP; a proxy needs a host and port")

// Addr returns the server's TCP address, host:port.
func (s *Server) Addr() (string, error) {
	cfg, err := pgconn.ParseConfig(s.adminDSN)
	if err != nil {
		return "", err
	}
	if strings.HasPrefix(cfg.Host, "/") {
		return "", errNoTCP
	}
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), nil
}

// Proxy starts a [Proxy] in front of the database's server, closed when the
// test ends, and returns it with a DSN that connects to the database through
// it.
func (d *DB) Proxy(t testing.TB, opts ...ProxyOption) (p *Proxy, dsn string) {
	t.Helper()
	addr, err := d.Server.Addr()
	if err != nil {
		t.Fatal(err)
	}
	var cfg proxyConfig
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.partitionable && d.Server.Mode() != ModeLocal {
		t.Skipf("pgtest: a partitionable proxy needs a local-mode server, not %s", d.Server.Mode())
	}
	p = NewProxy(t, addr, opts...)
	dsn, err = ViaProxy(d.DSN, p)
	if err != nil {
		t.Fatal(err)
	}
	return p, dsn
}

// ViaProxy returns dsn changed to connect through p instead of directly.
func ViaProxy(dsn string, p *Proxy) (string, error) { return viaAddr(dsn, p.Addr()) }

// viaAddr returns dsn changed to connect to addr (host:port).
func viaAddr(dsn, addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Host = addr
		q := u.Query()
		q.Del("host")
		q.Del("port")
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	return fmt.Sprintf("%s host=%s port=%s", dsn, host, port), nil
}
