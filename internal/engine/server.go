package engine

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// Server identifies the server and database a connection reached: its
// postmaster's start time (microseconds since the epoch), port and
// database. Two connections with the same Server reached one running
// server's database. A failover to another cluster, or a restart, changes
// it. The address (inet_server_addr()) is kept for messages only: one
// server may be reached at several of its addresses.
type Server struct {
	Started  string
	Port     string
	Database string
	Addr     string
}

// Key is the identity of s without its address.
func (s Server) Key() string { return s.Started + "/" + s.Port + "/" + s.Database }

func (s Server) String() string {
	return fmt.Sprintf("database %q on %s:%s (started %s µs after the epoch)", s.Database, s.Addr, s.Port, s.Started)
}

// identity is what a connection reports of its server and backend.
type identity struct {
	Server
	pid        string
	inRecovery bool
}

const identifySQL = "select pg_catalog.pg_backend_pid(), pg_catalog.pg_is_in_recovery(), pg_catalog.current_database(), " +
	"coalesce(pg_catalog.host(pg_catalog.inet_server_addr()), 'local socket'), coalesce(pg_catalog.inet_server_port()::text, ''), " +
	"(extract(epoch from pg_catalog.pg_postmaster_start_time()) * 1000000)::int8"

// untimed turns off, for the rest of a session, the role's timeouts that
// could cancel a probe statement or end a probe's open transaction (a
// role's statement_timeout = 1ms is no verdict on its server's locks). It
// is sent only on a connection that keeps its server session, where the
// setting stays with the probe's own session, never with a pooled one.
const untimed = "set statement_timeout = 0; set idle_in_transaction_session_timeout = 0; "

// identify reads c's server identity, backend pid and recovery state; with
// keeps (c keeps its server session), in the same round trip it first
// turns the role's timeouts off for c (see [untimed]).
func identify(ctx context.Context, c *pgconn.PgConn, keeps bool) (identity, error) {
	sql := identifySQL
	if keeps {
		sql = untimed + identifySQL
	}
	res, err := c.Exec(ctx, sql).ReadAll()
	if err != nil {
		return identity{}, fmt.Errorf("engine probe: the server's identity: %w", err)
	}
	if len(res) == 0 || len(res[len(res)-1].Rows) != 1 || len(res[len(res)-1].Rows[0]) != 6 {
		return identity{}, fmt.Errorf("engine probe: the server's identity: not one row of 6 values")
	}
	v := res[len(res)-1].Rows[0]
	return identity{
		Server:     Server{Started: string(v[5]), Port: string(v[4]), Database: string(v[2]), Addr: string(v[3])},
		pid:        string(v[0]),
		inRecovery: string(v[1]) == "t",
	}, nil
}

// Identify returns the identity of the server c reached (one round trip).
// c must keep its server session (no transaction-mode pooler: the caller
// probes that first): the role's statement timeouts are turned off for c
// in the same round trip, as the session settings that follow do anyway.
func Identify(ctx context.Context, c *pgconn.PgConn) (Server, error) {
	id, err := identify(ctx, c, true)
	return id.Server, err
}

// sameServer fails unless a and b reached one primary's database on two
// backends (the backends are compared only with sessions: behind a
// transaction-mode pooler two connections may lend the same backend in
// turn, and the transaction check needs no more than two transactions).
func sameServer(a, b identity, sessions bool) error {
	switch {
	case a.Key() != b.Key():
		return fmt.Errorf("engine probe: the second connection reached %s, not %s (a DNS or load-balancer change, or a failover, between the dials): no verdict", b.Server, a.Server)
	case a.inRecovery || b.inRecovery:
		return fmt.Errorf("engine probe: a connection reached a standby (pg_is_in_recovery()): no verdict")
	case sessions && a.pid == b.pid:
		return fmt.Errorf("engine probe: both connections reached server backend %s (a pooler lends one backend to both): no verdict", a.pid)
	}
	return nil
}
