// Package pooler tells whether a connection reaches PostgreSQL through a
// pooler, and whether that pooler keeps a client on one server session
// (session pooling, or no pooler) or moves it between sessions from one
// transaction to the next (transaction pooling, as PgBouncer, RDS Proxy
// and Supavisor do in transaction mode) or from one statement to the next
// (PgBouncer's statement mode, which refuses transactions).
package pooler

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

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
	// Statement: a pooler that lends a client a server session per
	// statement and ends a client that opens a transaction: no session
	// state, and no transaction of more than one statement either.
	Statement
)

// KeepsSession reports whether a client keeps one server session from one
// statement to the next (Direct, Session): only then do session locks,
// LISTEN and session settings follow it.
func (m Mode) KeepsSession() bool { return m == Direct || m == Session }

// String names the mode as pglocks' docs and the doctor do.
func (m Mode) String() string {
	switch m {
	case Direct:
		return "direct (no pooler)"
	case Session:
		return "pooler, session mode"
	case Transaction:
		return "pooler, transaction mode"
	case Statement:
		return "pooler, statement mode"
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
// chance to see a moved session despite other clients' traffic.
const probeRounds = 5

// probeRuns is how many statements in a row each round runs on the first
// connection before the second's transaction: a pooler that hands out its
// idle server sessions in turn (PgBouncer's server_round_robin) moves the
// first connection at its second statement.
const probeRuns = 3

// Probe tells Direct, Session, Transaction and Statement apart for first,
// a dedicated connection from pool that is idle (no transaction open).
//
// Behind a pooler it decides by what the server shows of session state:
// it marks first's server session (a custom setting, pglocks.probe, SET to
// a random value for the session) and then, in up to probeRounds rounds,
// (1) reads the mark probeRuns times in a row on first, (2) opens a
// transaction on a second connection from pool and reads the mark there,
// and (3) reads it on first again while that transaction is open. The mark
// and the backend's pid must be first's at every read on first, and never
// be seen by the second connection: only a pooler that keeps each client
// on its own server session passes every read (Session). A pooler that
// lends sessions per transaction fails one in each of PgBouncer's reuse
// orders: in turn, least recently used first (first moves at once, (1)),
// most recently used first (the second lands on first's session, (2)), or
// with a pool of one (the second's dial gets first's session). A pooler
// that refuses the second's BEGIN lends them per statement (Statement).
//
// Session is never mistaken for the others: no read can fail while first
// keeps its session. The other way round is possible when other clients'
// traffic moves the sessions just so in every round, and for a pooler that
// hands a client back the server session it used last whenever that one
// is idle (client affinity), which no statement of first or of a second
// client can tell from session pooling; PgBouncer does not do that. Behind
// a session pooler the probe needs one more server session for a moment
// (the second connection). ctx should be short: behind a pooler whose
// server pool is full the second's dial, or first's statement in (3),
// waits for a server session, and the probe then fails with ctx's error.
func Probe(ctx context.Context, pool *pgxpool.Config, first dial.Conn) (Mode, error) {
	if !Behind(first) {
		return Direct, nil
	}
	mark := newMark()
	if err := setMark(ctx, first, mark); err != nil {
		return 0, err
	}
	// To the pooler first reached, not the DSN's host list again: a
	// silent host listed before it (a partitioned node) would cost the
	// dial its time.
	second, err := dial.Dedicated(ctx, pool, dial.Options{ApplicationName: "pglocks pooler probe", Pin: first.PgConn().Conn().RemoteAddr()})
	if err != nil {
		return 0, fmt.Errorf("pooler probe: second connection: %w", err)
	}
	defer second.Close(context.WithoutCancel(ctx))
	if second.BackendPID == first.BackendPID {
		return pooled(ctx, second.PgConn())
	}
	for range probeRounds {
		moved, err := probeRound(ctx, first, second.PgConn(), mark)
		switch {
		case StatementPooling(err):
			return Statement, nil
		case err != nil:
			return 0, err
		case moved:
			return pooled(ctx, second.PgConn())
		}
	}
	return Session, nil
}

// probeRound reports whether first's statements ran on another server
// session than its own, or the second's transaction on first's.
func probeRound(ctx context.Context, first dial.Conn, second *pgconn.PgConn, mark string) (bool, error) {
	for range probeRuns {
		if own, err := onOwnSession(ctx, first, mark); err != nil || !own {
			return err == nil, err
		}
	}
	res, err := second.Exec(ctx, "begin; "+readMark).ReadAll()
	if err != nil {
		return false, fmt.Errorf("pooler probe: %w", err)
	}
	_, seen, err := markOf(res)
	if err != nil {
		return false, err
	}
	own, err := onOwnSession(ctx, first, mark)
	if _, rerr := second.Exec(ctx, "rollback").ReadAll(); err == nil && rerr != nil {
		err = fmt.Errorf("pooler probe: %w", rerr)
	}
	if err != nil {
		return false, err
	}
	return seen == mark || !own, nil
}

// pooled tells Transaction from Statement pooling on c, a connection
// behind a pooler that moves its clients between server sessions: only
// statement pooling refuses a transaction (and ends c).
func pooled(ctx context.Context, c *pgconn.PgConn) (Mode, error) {
	_, err := c.Exec(ctx, "begin; select 1").ReadAll() // a whole "begin; …; commit" passes as one statement
	if err == nil {
		_, err = c.Exec(ctx, "rollback").ReadAll()
	}
	switch {
	case StatementPooling(err):
		return Statement, nil
	case err != nil:
		return 0, fmt.Errorf("pooler probe: %w", err)
	}
	return Transaction, nil
}

// StatementPooling reports whether err is a pooler's refusal of a
// transaction: PgBouncer in statement mode ends the client with
// "transaction blocks not allowed in statement pooling mode" (08P01).
func StatementPooling(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "08P01" && strings.Contains(pe.Message, "statement pooling")
}

// readMark reads a session's backend pid and mark (empty if unset).
const readMark = "select pg_backend_pid(), current_setting('pglocks.probe', true)"

// newMark returns a value no other session's mark has.
func newMark() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// setMark marks first's server session with mark (hex digits only, so
// quoting is plain), as a session-level setting.
func setMark(ctx context.Context, first dial.Conn, mark string) error {
	_, err := first.PgConn().Exec(ctx, "set pglocks.probe = '"+mark+"'").ReadAll()
	if err != nil {
		return fmt.Errorf("pooler probe: mark session: %w", err)
	}
	return nil
}

// onOwnSession reads first's pid and mark and reports whether both are
// first's own.
func onOwnSession(ctx context.Context, first dial.Conn, mark string) (bool, error) {
	res, err := first.PgConn().Exec(ctx, readMark).ReadAll()
	if err != nil {
		return false, fmt.Errorf("pooler probe: %w", err)
	}
	pid, seen, err := markOf(res)
	if err != nil {
		return false, err
	}
	return pid == first.BackendPID && seen == mark, nil
}

// markOf parses readMark's row, the last result of res.
func markOf(res []*pgconn.Result) (uint32, string, error) {
	if len(res) == 0 {
		return 0, "", fmt.Errorf("pooler probe: no result")
	}
	last := res[len(res)-1]
	if len(last.Rows) != 1 || len(last.Rows[0]) != 2 {
		return 0, "", fmt.Errorf("pooler probe: %d rows where one was due", len(last.Rows))
	}
	pid, err := strconv.ParseUint(string(last.Rows[0][0]), 10, 32)
	if err != nil {
		return 0, "", fmt.Errorf("pooler probe: pg_backend_pid() = %q: %w", last.Rows[0][0], err)
	}
	return uint32(pid), string(last.Rows[0][1]), nil
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
