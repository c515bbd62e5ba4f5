// Package pooler tells whether a connection reaches PostgreSQL through a
// pooler, and whether that pooler keeps a client on one server session
// (session pooling, or no pooler) or moves it between sessions from one
// transaction to the next (transaction or statement pooling, as PgBouncer,
// RDS Proxy and Supavisor do in transaction mode).
package pooler

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/dial"
)

// Mode is what a probe found between the client and the server.
type Mode uint8

const (
	// Direct: no pooler; the backend process id the server announced at
	// connection is the one that runs the statements.
	Direct Mode = iota
	// Session: a pooler that keeps each client on one server session.
	Session
	// Transaction: a pooler that lends a client a server session per
	// transaction: session state (session advisory locks, LISTEN, SET,
	// prepared statements) does not follow the client.
	Transaction
)

// String names the mode as pglocks' docs and the doctor do.
func (m Mode) String() string {
	switch m {
	case Direct:
		return "direct (no pooler)"
	case Session:
		return "pooler, session mode"
	case Transaction:
		return "pooler, transaction mode"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// Behind reports whether c reaches its server through a pooler: the
// process id announced at startup (BackendKeyData) is not the one that
// runs c's statements. PgBouncer, RDS Proxy and Supavisor announce their
// own.
func Behind(c dial.Conn) bool { return c.PgConn().PID() != c.BackendPID }

// probeRounds bounds the rounds of a probe. One round suffices when no
// other client uses the pooler meanwhile; each more round gives another
// chance to see transaction pooling despite other clients' traffic.
const probeRounds = 5

// Probe tells Direct, Session and Transaction apart for first, a dedicated
// connection from pool that is idle (no transaction open). When first is
// behind a pooler it opens a second connection from pool (closed before
// returning) and, in up to probeRounds rounds, runs a statement on first
// (so that, under transaction pooling, first's server session is the one
// the pooler freed last), then holds a transaction open on the second and
// runs another statement on first. Under transaction pooling the second
// lands on first's server session, or first has to move to another;
// neither ever happens when each client keeps its own session, so Session
// is never mistaken for Transaction. The other way round is possible when
// other clients' traffic keeps taking first's server session in between,
// in every round. ctx should be short: behind a pooler whose server pool
// is full, first's statement waits for the second's transaction.
func Probe(ctx context.Context, pool *pgxpool.Config, first dial.Conn) (Mode, error) {
	if !Behind(first) {
		return Direct, nil
	}
	second, err := dial.Dedicated(ctx, pool, dial.Options{ApplicationName: "pglocks pooler probe"})
	if err != nil {
		return 0, fmt.Errorf("pooler probe: second connection: %w", err)
	}
	defer second.Close(context.WithoutCancel(ctx))
	if second.BackendPID == first.BackendPID {
		return Transaction, nil
	}
	for range probeRounds {
		moved, err := probeRound(ctx, first, second.PgConn())
		if err != nil || moved {
			return Transaction, err
		}
	}
	return Session, nil
}

// probeRound reports whether first's statements ran on another backend
// than its own, or the second's transaction on first's backend.
func probeRound(ctx context.Context, first dial.Conn, second *pgconn.PgConn) (bool, error) {
	if now, err := BackendPID(ctx, first.PgConn()); err != nil || now != first.BackendPID {
		return err == nil, err
	}
	res, err := second.Exec(ctx, "begin; select pg_backend_pid()").ReadAll()
	if err != nil {
		return false, fmt.Errorf("pooler probe: %w", err)
	}
	inTx, err := pidOf(res)
	if err != nil {
		return false, err
	}
	now, err := BackendPID(ctx, first.PgConn())
	if _, rerr := second.Exec(ctx, "rollback").ReadAll(); err == nil && rerr != nil {
		err = fmt.Errorf("pooler probe: %w", rerr)
	}
	if err != nil {
		return false, err
	}
	return inTx == first.BackendPID || now != first.BackendPID, nil
}

// BackendPID runs select pg_backend_pid() on pc (simple protocol, so it is
// safe through any pooler).
func BackendPID(ctx context.Context, pc *pgconn.PgConn) (uint32, error) {
	res, err := pc.Exec(ctx, "select pg_backend_pid()").ReadAll()
	if err != nil {
		return 0, fmt.Errorf("pooler probe: %w", err)
	}
	return pidOf(res)
}

func pidOf(res []*pgconn.Result) (uint32, error) {
	if len(res) == 0 {
		return 0, fmt.Errorf("pooler probe: no result")
	}
	last := res[len(res)-1]
	if len(last.Rows) != 1 || len(last.Rows[0]) != 1 {
		return 0, fmt.Errorf("pooler probe: pg_backend_pid() returned %d rows", len(last.Rows))
	}
	pid, err := strconv.ParseUint(string(last.Rows[0][0]), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("pooler probe: pg_backend_pid() = %q: %w", last.Rows[0][0], err)
	}
	return uint32(pid), nil
}
