package advisory

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/internal/lockstmt"
)

// TryXactLock takes the exclusive transaction-scoped lock on key in tx
// (pg_try_advisory_xact_lock), in one round trip, and fails with an error
// wrapping [ErrLocked] when another session holds it. The lock is released
// when tx commits or rolls back; there is no unlock.
//
// Transaction locks work through any connection, including PgBouncer in
// transaction pooling mode, where session locks ([Locker]) are unsafe.
// Note that the lock is re-entrant within tx's session, as in PostgreSQL.
// If ctx ends during the statement pgx closes tx's connection, so roll back
// on any error.
func TryXactLock(ctx context.Context, tx pgx.Tx, key pglocks.Key) error {
	return tryXact(ctx, "tryxactlock", tx, key, false)
}

// TryXactRLock is [TryXactLock] for the shared lock
// (pg_try_advisory_xact_lock_shared).
func TryXactRLock(ctx context.Context, tx pgx.Tx, key pglocks.Key) error {
	return tryXact(ctx, "tryxactrlock", tx, key, true)
}

// XactLock takes the exclusive transaction-scoped lock on key in tx,
// waiting until it is free or ctx ends. Like [Locker.Lock] it never waits
// on the server (a cancelled server-side wait can leave a ghost waiter that
// still takes the lock): it retries a try with jittered backoff from
// [DefaultMinBackoff] to [DefaultMaxBackoff]. Transaction locks are
// released by commit, which sends no notification, so waiters here poll.
func XactLock(ctx context.Context, tx pgx.Tx, key pglocks.Key) error {
	return waitXact(ctx, "xactlock", tx, key, false)
}

// XactRLock is [XactLock] for the shared lock.
func XactRLock(ctx context.Context, tx pgx.Tx, key pglocks.Key) error {
	return waitXact(ctx, "xactrlock", tx, key, true)
}

func checkXact(ctx context.Context, tx pgx.Tx, key pglocks.Key) error {
	switch {
	case ctx == nil:
		return errNilContext
	case tx == nil:
		return errors.New("nil tx (transaction locks need a transaction: begin one first)")
	}
	if err := key.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("context already done: %w", context.Cause(ctx))
	}
	return nil
}

func tryXact(ctx context.Context, op string, tx pgx.Tx, key pglocks.Key, shared bool) error {
	if err := checkXact(ctx, tx, key); err != nil {
		return opErr(op, key, err)
	}
	ok, err := tryXactOnce(ctx, tx, key, shared)
	if err != nil {
		return opErr(op, key, err)
	}
	if !ok {
		return opErr(op, key, ErrLocked)
	}
	return nil
}

func waitXact(ctx context.Context, op string, tx pgx.Tx, key pglocks.Key, shared bool) error {
	if err := checkXact(ctx, tx, key); err != nil {
		return opErr(op, key, err)
	}
	return opErr(op, key, poll(ctx, func() (bool, error) { return tryXactOnce(ctx, tx, key, shared) }))
}

func tryXactOnce(ctx context.Context, tx pgx.Tx, key pglocks.Key, shared bool) (bool, error) {
	sql, args := lockCall(lockstmt.TryXact(shared), key)
	var ok bool
	err := tx.QueryRow(ctx, sql, xactArgs(tx, args...)...).Scan(&ok)
	return ok, err
}

// xactArgs returns args with the exec mode of a transaction lock's
// statement in front (see xactExecMode) — or as they are for a tx with no
// *pgx.Conn behind it (an adapter, such as package stdsql's for
// database/sql), whose driver chooses its own protocol and would take the
// mode for an argument.
func xactArgs(tx pgx.Tx, args ...any) []any {
	if tx.Conn() == nil {
		return args
	}
	return append([]any{xactExecMode(tx)}, args...)
}

// xactExecMode is the exec mode of a transaction lock's statement: the
// connection's own, unless it caches prepared statements across
// transactions (pgx's default), which breaks behind a pooler in
// transaction mode: the next transaction may run on a server session that
// never saw the statement, or that another client prepared it on. Then
// QueryExecModeExec: one round trip, an unnamed statement, safe everywhere.
// tx.Conn() must not be nil.
func xactExecMode(tx pgx.Tx) pgx.QueryExecMode {
	switch m := tx.Conn().Config().DefaultQueryExecMode; m {
	case pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe:
		return pgx.QueryExecModeExec
	default:
		return m
	}
}
