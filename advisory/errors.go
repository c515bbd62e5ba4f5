package advisory

import (
	"errors"
	"strings"

	"github.com/pglocks/pglocks"
)

var (
	// ErrLocked is returned by TryLock, TryRLock and TryXactLock when the
	// key is held in a conflicting mode by another session, or by another
	// holder in this process. It is never returned for a transport error.
	ErrLocked = errors.New("advisory: locked by another holder")

	// ErrNotHeld is returned by [Lock.Unlock] for a lock that is no longer
	// held: unlocked before, lost, or released by [Locker.Close]. In the
	// last two cases the error also wraps [ErrLost] or [ErrClosed].
	ErrNotHeld = errors.New("advisory: not held")

	// ErrLost is the cause of a lost lock: its session died (backend
	// terminated, server restarted, connection cut or unresponsive), so
	// the server freed or will free the lock. [Locker.Do] returns an error
	// wrapping it when the lock was lost while fn ran.
	ErrLost = errors.New("advisory: lock lost")

	// ErrClosed is returned by every operation of a closed [Locker], and is
	// the cause reported by [Lock.Err] for a lock released by
	// [Locker.Close].
	ErrClosed = errors.New("advisory: locker closed")

	// ErrStandby is returned (wrapped, at once, by TryLock and Lock alike)
	// when the Locker's connection reached a server in recovery — a
	// standby, where pg_is_in_recovery() is true. Advisory locks work
	// there but exclude only that standby's own clients, so the Locker
	// refuses the session. Point the pool at the primary, or at every node
	// with target_session_attrs=read-write.
	ErrStandby = errors.New("advisory: the server is a standby (pg_is_in_recovery()); its locks would not exclude the primary's clients")

	// ErrTransactionPooling is returned by every session-lock operation of
	// a [Locker] whose pool reaches PostgreSQL through a pooler in
	// transaction mode (PgBouncer pool_mode=transaction, RDS Proxy,
	// Supavisor on port 6543), found by a probe when the Locker opens a
	// session: there a session lock would stay on whichever server session
	// ran the statement, held for nobody, or be "released" on another. It
	// is not retried. Use [XactLock] and its kin, or the lease package,
	// behind such a pooler, or give the Locker a pool that reaches
	// PostgreSQL directly or through a session-mode pooler.
	ErrTransactionPooling = errors.New("advisory: session locks refused: the pool reaches PostgreSQL through a pooler in transaction mode (use XactLock or leases, or a direct or session-mode connection)")
)

// opError says which operation on which key failed, and wraps why.
type opError struct {
	op  string
	key pglocks.Key
	err error
}

func (e *opError) Error() string {
	return "advisory: " + e.op + " " + e.key.String() + ": " + strings.TrimPrefix(e.err.Error(), "advisory: ")
}

func (e *opError) Unwrap() error { return e.err }

func opErr(op string, key pglocks.Key, err error) error {
	if err == nil {
		return nil
	}
	return &opError{op: op, key: key, err: err}
}
