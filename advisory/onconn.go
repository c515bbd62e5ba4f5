package advisory

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"weak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/internal/dial"
	"github.com/pglocks/pglocks/internal/lockstmt"
	"github.com/pglocks/pglocks/internal/outcome"
	"github.com/pglocks/pglocks/internal/pooler"
)

// SessionLock takes the exclusive session lock on key on conn, a
// connection the caller owns and keeps for as long as it holds the lock
// (a migration tool's connection, for instance): the lock is held until
// [SessionUnlock] on conn or until conn's session ends. It waits until the
// lock is free or ctx ends, the way [XactLock] does: a try
// (pg_try_advisory_lock) retried with jittered backoff from
// [DefaultMinBackoff] to [DefaultMaxBackoff], never a wait on the server,
// whose cancel could leave a ghost waiter that takes the lock later.
//
// Before the first try it checks conn's session, on every call: one round
// trip (pg_backend_pid, pg_is_in_recovery) on a direct connection. Behind
// a pooler, the first call on conn also makes the probe a [Locker] makes,
// which SETs the custom setting pglocks.probe on conn's session and opens
// a second connection from conn's config for a moment — it needs a second
// server session from the pooler, and costs about 5 ms on a local
// PgBouncer; its verdict is kept for conn, so later calls cost the one
// round trip. The probe is bounded by [PoolerCheckTimeout] whatever ctx
// says: a session-mode pooler with no free server session for it (conn
// has the last one) fails the call with an error that says so, rather than
// hanging for as long as ctx allows. Behind a pooler in transaction or
// statement mode it fails with [ErrTransactionPooling], on a standby with
// [ErrStandby], and takes nothing.
//
// conn is the caller's, with the caller's settings: unlike a Locker's
// connections it gets no tcp_user_timeout, keepalive or
// idle_session_timeout from pglocks, so if the holder is partitioned from
// the server, the server keeps its session, and the lock, until its TCP
// keepalives give up — about two hours with the OS defaults — and behind
// a pooler, whose server link stays healthy, until the pooler's own
// client keepalives do. Bound it yourself: on a direct connection, server
// settings in conn's DSN (pgx sends unknown DSN keys to the server), such
// as tcp_user_timeout=10000&tcp_keepalives_idle=5&tcp_keepalives_interval=2;
// behind a pooler, where those act on the pooler's link, SET
// idle_session_timeout (PostgreSQL 14 and later) on conn to a bound its
// holder never stays idle that long; and a deadline on ctx for the work.
//
// A try or unlock statement that fails after it was sent may have taken
// or kept the lock (a session lock outlives its statement's error), so
// conn is then closed: its session ends and the server frees every lock
// it held. When ctx ends while SessionLock waits between tries, nothing
// is held and conn stays open. Unlike a Locker's, this lock is not
// watched: losing conn loses the lock, and the caller learns it only from
// conn's next statement. Session locks are re-entrant per session, as in
// PostgreSQL: each SessionLock needs its SessionUnlock.
func SessionLock(ctx context.Context, conn *pgx.Conn, key pglocks.Key) error {
	return lockOnConn(ctx, "sessionlock", conn, key, true)
}

// TrySessionLock is [SessionLock] without the wait: when another session
// holds the lock it fails with an error wrapping [ErrLocked].
func TrySessionLock(ctx context.Context, conn *pgx.Conn, key pglocks.Key) error {
	return lockOnConn(ctx, "trysessionlock", conn, key, false)
}

// SessionUnlock releases one hold of the session lock on key taken on conn
// by [SessionLock] or [TrySessionLock]. If conn's session does not hold it
// (pg_advisory_unlock returns false) it fails with an error wrapping
// [ErrNotHeld]. If the statement fails after it was sent, conn is closed,
// which frees the lock once the server sees the connection end, and the
// error says so.
func SessionUnlock(ctx context.Context, conn *pgx.Conn, key pglocks.Key) error {
	const op = "sessionunlock"
	if err := checkOnConn(ctx, conn, key); err != nil {
		return opErr(op, key, err)
	}
	ok, err := callOnConn(ctx, conn, lockstmt.Unlock, key)
	switch {
	case err != nil:
		return opErr(op, key, err)
	case !ok:
		return opErr(op, key, ErrNotHeld)
	}
	return nil
}

func lockOnConn(ctx context.Context, op string, conn *pgx.Conn, key pglocks.Key, wait bool) error {
	if err := checkOnConn(ctx, conn, key); err != nil {
		return opErr(op, key, err)
	}
	if err := checkSession(ctx, conn); err != nil {
		return opErr(op, key, err)
	}
	try := func() (bool, error) { return callOnConn(ctx, conn, lockstmt.TryLock, key) }
	if wait {
		return opErr(op, key, poll(ctx, try))
	}
	ok, err := try()
	if err == nil && !ok {
		err = ErrLocked
	}
	return opErr(op, key, err)
}

func checkOnConn(ctx context.Context, conn *pgx.Conn, key pglocks.Key) error {
	switch {
	case ctx == nil:
		return errNilContext
	case conn == nil:
		return errors.New("nil *pgx.Conn")
	case conn.IsClosed():
		return errors.New("connection closed")
	}
	if err := key.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("context already done: %w", context.Cause(ctx))
	}
	return nil
}

// PoolerCheckTimeout bounds the pooler probe of [SessionLock] and
// [TrySessionLock], whatever their ctx: behind a session-mode pooler the
// probe's second connection waits for a free server session, which may
// never come.
const PoolerCheckTimeout = 10 * time.Second

// keptSession holds the connections whose session a probe found kept
// (behind a session-mode pooler), so that later calls on them skip the
// probe: keyed by a weak pointer to the connection's *pgconn.PgConn, and
// dropped once the connection is garbage.
var keptSession sync.Map // weak.Pointer[pgconn.PgConn] → struct{}

// rememberKept records that pc's session is kept from one statement to the
// next; a client of a session-mode pooler stays on its server session.
func rememberKept(pc *pgconn.PgConn) {
	k := weak.Make(pc)
	if _, had := keptSession.LoadOrStore(k, struct{}{}); !had {
		runtime.AddCleanup(pc, func(k weak.Pointer[pgconn.PgConn]) { keptSession.Delete(k) }, k)
	}
}

// checkSession refuses conn when its statements may run on more than one
// server session (a pooler in transaction or statement mode) or on a
// standby, as a Locker refuses such a session (see [Locker.connect]).
func checkSession(ctx context.Context, conn *pgx.Conn) error {
	dc := dial.Conn{Conn: conn}
	err := conn.QueryRow(ctx, "select pg_backend_pid(), pg_is_in_recovery()",
		pgx.QueryExecModeSimpleProtocol).Scan(&dc.BackendPID, &dc.InRecovery)
	if err != nil {
		return fmt.Errorf("check session: %w", err)
	}
	if dc.InRecovery {
		return outcome.MarkFatal(ErrStandby)
	}
	if !pooler.Behind(dc) {
		return nil
	}
	if _, ok := keptSession.Load(weak.Make(conn.PgConn())); ok {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, PoolerCheckTimeout)
	defer cancel()
	err = refuseTransactionPooling(pctx, &pgxpool.Config{ConnConfig: conn.Config()}, dc)
	switch {
	case err == nil:
		rememberKept(conn.PgConn())
	case ctx.Err() == nil && pctx.Err() != nil:
		return fmt.Errorf("check session: the pooler check needs a second server session; is the pool full? "+
			"(none came within %v: conn may hold the pooler's last server session): %w", PoolerCheckTimeout, err)
	}
	return err
}

// callOnConn runs fn (pg_try_advisory_lock or pg_advisory_unlock) on key
// and returns its answer. A failure after the statement was sent closes
// conn: the lock's state on the session is unknown, and ending the
// session settles it (no lock).
func callOnConn(ctx context.Context, conn *pgx.Conn, fn lockstmt.Fn, key pglocks.Key) (bool, error) {
	sql, args := lockCall(fn, key)
	var ok bool
	err := conn.QueryRow(ctx, sql, args...).Scan(&ok)
	if err == nil || pgconn.SafeToRetry(err) {
		return ok, err // done, or never sent
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = conn.Close(cctx)
	return false, fmt.Errorf("%w (connection closed: the statement may have run, and the session's locks end with it)", err)
}

// lockCall returns the statement that calls the advisory-lock function fn
// on key (pg_catalog-qualified, its parameters typed: see
// internal/lockstmt), and its arguments.
func lockCall(fn lockstmt.Fn, key pglocks.Key) (string, []any) {
	if hi, lo, isPair := key.Pair(); isPair {
		return lockstmt.Select(fn, true), []any{hi, lo}
	}
	return lockstmt.Select(fn, false), []any{key.Int64()}
}

// poll calls try until it reports the lock taken, fails, or ctx ends,
// sleeping a jittered backoff from DefaultMinBackoff, doubling up to
// DefaultMaxBackoff, between tries.
func poll(ctx context.Context, try func() (bool, error)) error {
	backoff := DefaultMinBackoff
	for {
		ok, err := try()
		if err != nil || ok {
			return err
		}
		t := time.NewTimer(jitter(backoff))
		backoff = min(2*backoff, DefaultMaxBackoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		}
	}
}
