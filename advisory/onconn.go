package advisory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/internal/dial"
	"github.com/pglocks/pglocks/internal/outcome"
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
// Before the first try it checks conn's session, in one round trip (and,
// behind a pooler, the probe a [Locker] makes, which SETs the custom
// setting pglocks.probe on conn's session and opens one more connection
// from conn's config for a moment): behind a pooler in transaction or
// statement mode it fails with [ErrTransactionPooling], on a standby with
// [ErrStandby], and takes nothing.
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
	ok, err := callOnConn(ctx, conn, "pg_advisory_unlock", key)
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
	try := func() (bool, error) { return callOnConn(ctx, conn, "pg_try_advisory_lock", key) }
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
	return refuseTransactionPooling(ctx, &pgxpool.Config{ConnConfig: conn.Config()}, dc)
}

// callOnConn runs fn (pg_try_advisory_lock or pg_advisory_unlock) on key
// and returns its answer. A failure after the statement was sent closes
// conn: the lock's state on the session is unknown, and ending the
// session settles it (no lock).
func callOnConn(ctx context.Context, conn *pgx.Conn, fn string, key pglocks.Key) (bool, error) {
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
// on key, and its arguments.
func lockCall(fn string, key pglocks.Key) (string, []any) {
	if hi, lo, isPair := key.Pair(); isPair {
		return "select " + fn + "($1::int4, $2::int4)", []any{hi, lo}
	}
	return "select " + fn + "($1::int8)", []any{key.Int64()}
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
