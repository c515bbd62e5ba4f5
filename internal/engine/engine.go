// Package engine proves, on the server a pool reaches, the server-side
// behaviour pglocks relies on but cannot read from a version string:
// that session advisory locks taken by one session are refused to another
// as PostgreSQL's are (exclusive against all, shared against exclusive,
// shared with shared) and freed by unlock, that a transaction advisory
// lock is refused to another session while its transaction is open, and
// that clock_timestamp() advances within a transaction (a lease's expiry
// is judged by it). PostgreSQL-compatible engines differ exactly there:
// CockroachDB's session advisory-lock functions return success without
// locking.
//
// The probe runs pglocks' own statement texts (internal/lockstmt:
// pg_catalog-qualified, parameters typed) with the extended protocol and
// binary parameters, as the advisory Locker sends them, for every form
// the Locker uses: exclusive and shared, bigint and (int4, int4) keys.
// Because the calls are qualified, a schema before pg_catalog in the
// search_path or an overload elsewhere cannot replace the functions they
// reach; the probe proves that the server's own functions exclude.
// clock_timestamp() is called unqualified, as the lease package's
// statements call it, so the probe sees the clock they see.
//
// It runs on a connection the caller already has and one more short-lived
// connection of its own (the second session a lock must exclude), on
// random keys that no other client uses. Where the sessions are its own
// (sessions true) it runs them with statement_timeout 0 and
// idle_session_timeout a minute, reset to the role's defaults after, so
// that a role's short timeouts cannot make it no verdict; ctx bounds it.
// Otherwise its statements run under the role's statement_timeout (one it
// cancels is an error, no verdict). Both connections must reach the same
// server and database, a primary, on two server backends (see
// [Server]): a second connection that lands elsewhere — another server
// after a DNS or load-balancer flip,
// a standby, another database, or the same backend through a pooler —
// proves nothing, and is an error, never a [Failure].
//
// Each check's finding is done (ok, or a named *Failure) or, when a
// statement failed on the way, an error: a transport or server error is
// no verdict, and the caller must not take it for one. A check's error
// does not stop the others.
package engine

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/dial"
)

// Primitive names one server-side behaviour the probe checks.
type Primitive string

// The behaviours probed.
const (
	SessionLocks Primitive = "session advisory locks"
	XactLocks    Primitive = "transaction advisory locks"
	Clock        Primitive = "clock_timestamp()"
)

// Failure is a probe's finding that a primitive does not behave as
// PostgreSQL's does.
type Failure struct {
	Primitive Primitive
	What      string // what the server did, in a few words
}

func (f *Failure) Error() string { return string(f.Primitive) + ": " + f.What }

// Finding is one check's outcome: ok (both nil), a Failure, or Err when
// the check could not decide (no verdict).
type Finding struct {
	Failure *Failure
	Err     error
}

// Decided reports whether the check reached a verdict.
func (f Finding) Decided() bool { return f.Err == nil }

// Report is what [Probe] found, one Finding per primitive.
type Report struct {
	// Server is the identity of the server the caller's connection
	// reached (zero if it could not be read).
	Server Server
	// SessionSkipped: session locks were not probed (the caller's
	// connection is behind a transaction-mode pooler, which would strand
	// the probe's lock); SessionLocks is empty then.
	SessionSkipped bool
	SessionLocks   Finding
	XactLocks      Finding
	Clock          Finding
}

// Failures returns the report's failures, in the order above.
func (r Report) Failures() []*Failure {
	var out []*Failure
	for _, f := range []Finding{r.SessionLocks, r.XactLocks, r.Clock} {
		if f.Failure != nil {
			out = append(out, f.Failure)
		}
	}
	return out
}

// Probe checks every primitive on first, a dedicated connection from pool
// that keeps its server session (no transaction-mode pooler; the caller
// probes that first) and has no transaction open, and on one more
// connection it opens from pool for the purpose and closes before
// returning. It leaves no lock behind on either (every lock is taken on a
// random key and released, or dies with the closed connection). With
// sessions false, first may be behind a transaction-mode pooler and
// session locks are not probed. A check that fails on the way records its
// error and the others still run.
func Probe(ctx context.Context, pool *pgxpool.Config, first dial.Conn, sessions bool) Report {
	a := first.PgConn()
	r := Report{SessionSkipped: !sessions}
	srv, err := identify(ctx, a, sessions)
	r.Server = srv.Server
	if err == nil && sessions {
		var restore func()
		if restore, err = holdSettings(ctx, a); err == nil {
			defer restore()
		}
	}
	var b *pgconn.PgConn
	if err == nil {
		var done func()
		b, done, err = pairWith(ctx, pool, srv, a.Conn().RemoteAddr(), sessions)
		if err == nil {
			defer done()
		}
	}
	if err != nil {
		if sessions {
			r.SessionLocks.Err = err
		}
		r.XactLocks.Err = err
	} else {
		if sessions {
			r.SessionLocks.Failure, r.SessionLocks.Err = sessionLocks(ctx, a, b)
		}
		r.XactLocks.Failure, r.XactLocks.Err = xactLocks(ctx, a, b)
	}
	r.Clock.Failure, r.Clock.Err = clock(ctx, a)
	return r
}

// SessionOnly checks session advisory locks alone (see [Probe]): the
// advisory Locker needs no more. It returns the identity of the server
// first reached, the failure if any, or an error (no verdict).
func SessionOnly(ctx context.Context, pool *pgxpool.Config, first dial.Conn) (Server, *Failure, error) {
	a := first.PgConn()
	srv, err := identify(ctx, a, true)
	if err != nil {
		return Server{}, nil, err
	}
	restore, err := holdSettings(ctx, a)
	if err != nil {
		return srv.Server, nil, err
	}
	defer restore()
	b, done, err := pairWith(ctx, pool, srv, a.Conn().RemoteAddr(), true)
	if err != nil {
		return srv.Server, nil, err
	}
	defer done()
	f, err := sessionLocks(ctx, a, b)
	return srv.Server, f, err
}

// pairWith opens the probe's second connection, to at, the address the
// first one reached (not the DSN's host list again: a host listed before
// it that does not answer would cost the dial its time), and checks that
// it reached the server of a (whose identity is first): see [sameServer].
// done closes it.
func pairWith(ctx context.Context, pool *pgxpool.Config, first identity, at net.Addr, sessions bool) (*pgconn.PgConn, func(), error) {
	opts := dial.Options{ApplicationName: "pglocks engine probe", Pin: at}
	if sessions {
		// The role's statement_timeout and idle_session_timeout (1 ms,
		// 100 ms, say) must not cancel a probe statement or end the
		// probe's own session while the machine is slow: that would be no
		// verdict, and refuse the Locker. Only where the session is the
		// probe's own (never a pooled one); the dial's ctx bounds it.
		opts.Settings = probeSettings
	}
	second, err := dial.Dedicated(ctx, pool, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("engine probe: second connection: %w", err)
	}
	done := func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = second.Close(cctx)
	}
	b := second.PgConn()
	other, err := identify(ctx, b, sessions)
	if err == nil {
		err = sameServer(first, other, sessions)
	}
	if err != nil {
		done()
		return nil, nil, err
	}
	return b, done, nil
}

// probeIdleTimeout is the idle_session_timeout of the probe's sessions
// while a probe runs (see probeSettings).
const probeIdleTimeout = time.Minute

// cleanupTimeout bounds a statement or close that cleans up after the
// probe, whatever the caller's ctx.
const cleanupTimeout = 5 * time.Second

// xactLocks opens a transaction on b that takes a random key of each form,
// exclusive, and tries it on a, exclusive and shared (each must be
// refused); then rolls b's transaction back.
func xactLocks(ctx context.Context, a, b *pgconn.PgConn) (*Failure, error) {
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_, _ = b.Exec(cctx, "rollback").ReadAll()
	}()
	if _, err := b.Exec(ctx, "begin").ReadAll(); err != nil {
		return nil, fmt.Errorf("engine probe: begin: %w", err)
	}
	for _, pair := range []bool{false, true} {
		k := newKey(pair)
		got, err := k.call(ctx, b, tryXact(false), pair)
		switch {
		case err != nil:
			return nil, err
		case !got:
			return &Failure{XactLocks, k.name(tryXact(false)) + " refused a key no session holds"}, nil
		}
		for _, shared := range []bool{false, true} {
			other, err := k.call(ctx, a, tryXact(shared), pair)
			switch {
			case err != nil:
				return nil, err
			case other:
				return &Failure{XactLocks, k.name(tryXact(shared)) + " granted a key another transaction holds exclusively: locks do not exclude"}, nil
			}
		}
	}
	return nil, nil
}

// clock checks that clock_timestamp() is later than the transaction's
// start after a pause inside it: a lease row is tested and stamped with
// clock_timestamp(), and a frozen clock would make expiry never come.
func clock(ctx context.Context, a *pgconn.PgConn) (*Failure, error) {
	moved, err := boolOf(ctx, a, "select clock_timestamp() > pg_catalog.now() from pg_catalog.pg_sleep(0.002)")
	switch {
	case err != nil:
		return nil, err
	case !moved:
		return &Failure{Clock, "did not advance within a transaction"}, nil
	}
	return nil, nil
}

// boolOf runs sql (simple protocol) on c and returns the boolean in the
// last row of its last result.
func boolOf(ctx context.Context, c *pgconn.PgConn, sql string) (bool, error) {
	res, err := c.Exec(ctx, sql).ReadAll()
	if err != nil {
		return false, fmt.Errorf("engine probe: %s: %w", sql, err)
	}
	if len(res) == 0 || len(res[len(res)-1].Rows) != 1 || len(res[len(res)-1].Rows[0]) != 1 {
		return false, fmt.Errorf("engine probe: %s: not one value", sql)
	}
	return parseBool(sql, res[len(res)-1].Rows[0][0])
}

func parseBool(sql string, v []byte) (bool, error) {
	switch string(v) {
	case "t":
		return true, nil
	case "f":
		return false, nil
	default:
		return false, fmt.Errorf("engine probe: %s: %q is no boolean", sql, v)
	}
}

// holdSettings sets, on a, the session being probed (its own, never a pooled
// one), statement_timeout to 0 and idle_session_timeout to
// probeIdleTimeout while the probe dials its second connection and goes
// back and forth between the two: the role's own settings (1 ms, 100 ms,
// say) must not cancel a probe statement or end a meanwhile, which would
// be no verdict; the dial's ctx bounds the probe. restore resets both to
// the role's and database's defaults, which the session then keeps.
func holdSettings(ctx context.Context, a *pgconn.PgConn) (restore func(), err error) {
	q := probeSettings(a)
	if err := dial.Exec(ctx, a, q); err != nil {
		return nil, fmt.Errorf("engine probe: %s: %w", q, err)
	}
	return func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = dial.Exec(cctx, a, "reset statement_timeout; reset idle_session_timeout")
	}, nil
}

// probeSettings is the SQL that sets a probe session's statement_timeout
// to 0 and, where the server has it, its idle_session_timeout to
// probeIdleTimeout.
func probeSettings(pc *pgconn.PgConn) string {
	q := "set statement_timeout = 0"
	if idle := dial.IdleSessionTimeout(pc, probeIdleTimeout); idle != "" {
		q += "; " + idle
	}
	return q
}
