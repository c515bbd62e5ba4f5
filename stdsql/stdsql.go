// Package stdsql lets services on database/sql (GORM, sqlx, Bun, plain
// *sql.DB with pgx's stdlib driver or lib/pq) use pglocks inside their own
// transactions: transaction-scoped advisory locks, and fencing their writes
// with a lease's or a leader term's Guard, so that the writes commit only
// while the lease is really held.
//
//	tx, _ := db.BeginTx(ctx, nil)
//	if err := stdsql.Guard(ctx, tx, lease); err != nil { tx.Rollback(); … }
//	tx.ExecContext(ctx, "update …")
//	tx.Commit()
//
// Leases, Lockers and Electors themselves stay on a pgxpool.Pool: they need
// their own sessions (session locks, LISTEN) which a database/sql pool does
// not hand out. Only the statements run in the caller's transaction go
// through database/sql — and session locks on a *sql.Conn the caller keeps
// ([SessionLock], [SessionUnlock]; package gooselock uses them for goose
// migrations), which need pgx's stdlib driver: through it they check that
// the connection keeps its server session (no pooler in transaction or
// statement mode). Unlock before conn.Close: database/sql does not know of
// the lock and would hand the connection out again still holding it, and
// session locks being re-entrant, the next borrower that locks the same
// key on it would get it at once, without waiting — two holders in one
// process, neither excluded. The connection gets no timeouts from
// pglocks: see advisory.SessionLock for bounding a partitioned holder.
//
// [Tx] adapts a *sql.Tx to the pgx.Tx those functions take. It supports
// what they use — QueryRow and Exec — and Commit and Rollback; the other
// methods return an error saying they are not supported (Conn returns nil,
// LargeObjects a zero value that must not be used).
package stdsql

import (
	"context"
	"database/sql"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
)

// errNilTx is the error for a nil *sql.Tx.
var errNilTx = errors.New("stdsql: nil *sql.Tx (begin a transaction first)")

// Guard is [lease.Lease.Guard] in tx: it checks that l is still held and
// locks its row FOR SHARE until tx ends. Not held: an error wrapping
// [lease.ErrNotHeld]; roll tx back.
func Guard(ctx context.Context, tx *sql.Tx, l *lease.Lease) error {
	if tx == nil {
		return errNilTx
	}
	if l == nil {
		return errors.New("stdsql: nil *lease.Lease")
	}
	return l.Guard(ctx, Tx(tx))
}

// GuardTerm is [leader.Term.Guard] in tx.
func GuardTerm(ctx context.Context, tx *sql.Tx, t leader.Term) error {
	if tx == nil {
		return errNilTx
	}
	return t.Guard(ctx, Tx(tx))
}

// TryXactLock is [advisory.TryXactLock] in tx: busy is an error wrapping
// [advisory.ErrLocked]; the lock is released when tx ends.
func TryXactLock(ctx context.Context, tx *sql.Tx, key pglocks.Key) error {
	if tx == nil {
		return errNilTx
	}
	return advisory.TryXactLock(ctx, Tx(tx), key)
}

// XactLock is [advisory.XactLock] in tx: it waits until the lock is free
// or ctx ends.
func XactLock(ctx context.Context, tx *sql.Tx, key pglocks.Key) error {
	if tx == nil {
		return errNilTx
	}
	return advisory.XactLock(ctx, Tx(tx), key)
}

// Tx returns tx as a pgx.Tx for pglocks' functions that run statements in
// the caller's transaction (see the package doc for what it supports). A
// nil tx gives nil.
func Tx(tx *sql.Tx) pgx.Tx {
	if tx == nil {
		return nil
	}
	return sqlTx{tx}
}

type sqlTx struct{ tx *sql.Tx }

var errUnsupported = errors.New("stdsql: not supported on a database/sql transaction")

func (t sqlTx) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return row{t.tx.QueryRowContext(ctx, query, args...)}
}

func (t sqlTx) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	res, err := t.tx.ExecContext(ctx, query, args...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		n = 0 // the driver does not say: a tag without a count
	}
	return pgconn.NewCommandTag("EXEC " + strconv.FormatInt(n, 10)), nil
}

func (t sqlTx) Commit(context.Context) error   { return t.tx.Commit() }
func (t sqlTx) Rollback(context.Context) error { return t.tx.Rollback() }

func (sqlTx) Begin(context.Context) (pgx.Tx, error) { return nil, errUnsupported }
func (sqlTx) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, errUnsupported
}
func (sqlTx) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults { return failedBatch{} }
func (sqlTx) LargeObjects() pgx.LargeObjects                         { return pgx.LargeObjects{} }
func (sqlTx) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	return nil, errUnsupported
}
func (sqlTx) Query(context.Context, string, ...any) (pgx.Rows, error) { return nil, errUnsupported }
func (sqlTx) Conn() *pgx.Conn                                         { return nil }

// row translates database/sql's ErrNoRows into pgx's, which pglocks
// checks for.
type row struct{ r *sql.Row }

func (r row) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return pgx.ErrNoRows
	}
	return err
}

type failedBatch struct{}

func (failedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, errUnsupported }
func (failedBatch) Query() (pgx.Rows, error)         { return nil, errUnsupported }
func (failedBatch) QueryRow() pgx.Row                { return errRow{} }
func (failedBatch) Close() error                     { return errUnsupported }
func (failedBatch) Tx() pgx.Tx                       { return nil }

type errRow struct{}

func (errRow) Scan(...any) error { return errUnsupported }
