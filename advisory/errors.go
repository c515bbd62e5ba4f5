package advisory

import (
	"errors"
	"fmt"
	"strings"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/internal/outcome"
)

var (
	// ErrLocked is returned by TryLock, TryRLock and TryXactLock when the
	// key is held in a conflicting mode by another session, or by another
	// holder in this process; by TryLockAll when one of its keys is; and
	// by Semaphore.TryAcquire when too few permits are free. It is never
	// returned for a transport error.
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

	// ErrLockTableFull is returned (wrapped with the operation, the key and
	// the server's error, SQLSTATE 53200) by TryLock, Lock, TryRLock,
	// RLock, Do and the transaction locks when the server's shared lock
	// table is full: it holds about max_locks_per_transaction ×
	// (max_connections + max_prepared_transactions) locks of every
	// session together (see "Capacity" in the package doc). Nothing was
	// taken, and the Locker's sessions and the locks on them are intact.
	// Lock and RLock return it at once rather than wait: a full table
	// fails every client of the server that needs one more lock, and a
	// wait would hide that. Entries come back as locks are released, so a
	// later call may succeed; the lasting cure is a larger
	// max_locks_per_transaction (a server restart) or fewer locks held.
	ErrLockTableFull = errors.New("advisory: the server's lock table is full (raise max_locks_per_transaction, or hold fewer locks)")

	// ErrTransactionPooling is returned by every session-lock operation of
	// a [Locker] whose pool reaches PostgreSQL through a pooler in
	// transaction or statement mode (PgBouncer pool_mode=transaction or
	// statement, RDS Proxy, Supavisor on port 6543), found by a probe when the Locker opens a
	// session: there a session lock would stay on whichever server session
	// ran the statement, held for nobody, or be "released" on another. It
	// is not retried. Use [XactLock] and its kin, or the lease package,
	// behind such a pooler, or give the Locker a pool that reaches
	// PostgreSQL directly or through a session-mode pooler.
	ErrTransactionPooling = errors.New("advisory: session locks refused: the pool reaches PostgreSQL through a pooler in transaction or statement mode (use XactLock or leases, or a direct or session-mode connection)")

	// ErrLocksDoNotExclude is returned (wrapped with what the server did,
	// at once, by every session-lock operation of a [Locker]) when the
	// server's own session advisory locks do not exclude across sessions:
	// a probe key the Locker took on its first session to that server was
	// granted to a second session too, in some form the Locker uses
	// (exclusive or shared, bigint or pair key), or unlock did not free it
	// — found twice, on two pairs of connections to the same server.
	// CockroachDB's pg_advisory_lock functions are such stubs (documented
	// by the vendor; this refusal is tested here against PostgreSQL whose
	// own functions are made to lie, not against CockroachDB). pglocks calls
	// the functions pg_catalog-qualified with typed parameters, so a
	// search_path or an overload elsewhere cannot replace them. It is not
	// retried for that server; a Locker whose connections later reach
	// another server (a failover) probes that one. The lease package is no
	// remedy on CockroachDB (not supported there); on another such engine,
	// run `pglocks doctor --need=leases` before relying on leases.
	ErrLocksDoNotExclude = errors.New("advisory: session locks refused: the server's advisory locks do not exclude across sessions")
)

// opError says which operation on what failed — a key, or what names a
// set of keys or a semaphore when set — and wraps why.
type opError struct {
	op   string
	key  pglocks.Key
	what string
	err  error
}

func (e *opError) Error() string {
	what := e.what
	if what == "" {
		what = e.key.String() // formatted only when the message is read
	}
	return "advisory: " + e.op + " " + what + ": " + strings.TrimPrefix(e.err.Error(), "advisory: ")
}

func (e *opError) Unwrap() error { return e.err }

func opErr(op string, key pglocks.Key, err error) error {
	if err == nil {
		return nil
	}
	return &opError{op: op, key: key, err: nameCapacity(err)}
}

// opErrOn is opErr for a set of keys or a semaphore, named by what; with
// what empty, the message names the operation only.
func opErrOn(op, what string, err error) error {
	if err == nil {
		return nil
	}
	if what == "" {
		return fmt.Errorf("advisory: %s: %w", op, err)
	}
	return &opError{op: op, what: what, err: nameCapacity(err)}
}

// nameCapacity wraps an error that says the server's lock table is full
// with [ErrLockTableFull].
func nameCapacity(err error) error {
	if outcome.LockTableFull(err) && !errors.Is(err, ErrLockTableFull) {
		return fmt.Errorf("%w: %w", ErrLockTableFull, err)
	}
	return err
}
