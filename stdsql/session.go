package stdsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
)

// SessionLock is [advisory.SessionLock] on conn: it takes the exclusive
// session lock on key on conn's session, waiting until it is free or ctx
// ends. The lock is held until [SessionUnlock] on conn or until the
// session ends; unlock before conn.Close, or the connection goes back to
// the *sql.DB still holding it — and since session locks are re-entrant,
// the next borrower of that connection that locks key gets it at once,
// without waiting, while a real waiter elsewhere waits for nobody. conn
// must come from pgx's stdlib driver (import _
// "github.com/jackc/pgx/v5/stdlib"; sql.Open("pgx", dsn)), through which
// the session is checked for a pooler in transaction or statement mode
// (refused with [advisory.ErrTransactionPooling]); with another driver,
// or a wrapper around pgx's driver connection, it fails and takes
// nothing. The check costs one round trip on every call, and behind a
// pooler a second connection on the first call on conn (see
// advisory.SessionLock, also for bounding a partitioned holder: conn gets
// no timeouts from pglocks). If a lock statement fails after it was sent,
// the session is closed (see advisory.SessionLock) and database/sql
// discards the connection.
func SessionLock(ctx context.Context, conn *sql.Conn, key pglocks.Key) error {
	return onPgxConn(conn, func(c *pgx.Conn) error { return advisory.SessionLock(ctx, c, key) })
}

// TrySessionLock is [SessionLock] without the wait: when another session
// holds the lock it fails with an error wrapping [advisory.ErrLocked].
func TrySessionLock(ctx context.Context, conn *sql.Conn, key pglocks.Key) error {
	return onPgxConn(conn, func(c *pgx.Conn) error { return advisory.TrySessionLock(ctx, c, key) })
}

// SessionUnlock is [advisory.SessionUnlock] on conn: it releases the
// session lock on key that [SessionLock] took on conn, and fails with an
// error wrapping [advisory.ErrNotHeld] when conn's session does not hold
// it.
func SessionUnlock(ctx context.Context, conn *sql.Conn, key pglocks.Key) error {
	return onPgxConn(conn, func(c *pgx.Conn) error { return advisory.SessionUnlock(ctx, c, key) })
}

// onPgxConn runs f on the *pgx.Conn behind conn, which database/sql keeps
// for f alone while it runs.
func onPgxConn(conn *sql.Conn, f func(*pgx.Conn) error) error {
	if conn == nil {
		return errors.New("stdsql: nil *sql.Conn (take one with db.Conn)")
	}
	return conn.Raw(func(dc any) error {
		pc, ok := dc.(interface{ Conn() *pgx.Conn })
		if !ok {
			return fmt.Errorf(`stdsql: session locks need a *sql.Conn of pgx's stdlib driver, which lets them check the session for a pooler: `+
				`import _ "github.com/jackc/pgx/v5/stdlib" and open the *sql.DB with sql.Open("pgx", dsn) (or stdlib.OpenDBFromPool); `+
				`its driver connection is a %T`, dc)
		}
		return f(pc.Conn())
	})
}
