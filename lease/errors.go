package lease

import (
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

var (
	// ErrHeld is wrapped by the error of a failed [Store.TryAcquire]: another
	// owner holds the lease and it has not expired by the server clock. The
	// error is a [*HeldError] carrying the holder.
	ErrHeld = errors.New("lease: held by another owner")

	// ErrNotHeld is returned by Renew, Release, Assert, Guard and Resume when
	// the lease is not held by this (name, owner, token) any more: the row
	// has another owner or token, has expired by the server clock, was
	// released or broken, or does not exist: every way a lease can have
	// ended, in one sentinel.
	ErrNotHeld = errors.New("lease: not held")

	// ErrLost is the cause of a lease's [Lease.Context] and the error of
	// [Lease.Err] once the lease has been lost: taken over, expired, broken,
	// no longer trusted locally because renewals did not succeed in time, or
	// released with an outcome that is unknown (the reply never came).
	ErrLost = errors.New("lease: lost")

	// ErrReleased is the cause of a lease's [Lease.Context] after
	// [Lease.Release] gave it up: the release ran, or it could not be sent
	// and goes on in the background (the cause, and Release's error, then
	// wrap ErrReleased and say so).
	ErrReleased = errors.New("lease: released")

	// ErrTimeLeft is returned by [Lease.Assert] when the lease is held but
	// has less time left by the server clock than asked for.
	ErrTimeLeft = errors.New("lease: not enough time left")

	// ErrNotFound is returned by [Store.Get] for a name that has never been
	// acquired.
	ErrNotFound = errors.New("lease: not found")

	// ErrClosed is returned by every operation of a [Store] after
	// [Store.Close], and by the leases it made.
	ErrClosed = errors.New("lease: store closed")

	// ErrInvalidTTL is wrapped by the error for a TTL that is not positive,
	// below [MinTTL], or above the store's Config.MaxTTL.
	ErrInvalidTTL = errors.New("lease: invalid ttl")

	// ErrInvalidConfig is wrapped by every error of [New] about its Config.
	ErrInvalidConfig = errors.New("lease: invalid config")

	// ErrNoTable is wrapped, with the server's error (SQLSTATE 42P01), by
	// the error of every operation that found no lease table: the error
	// names the table and the ways to create it — [Store.Migrate], the DDL
	// of [SchemaSQL] in a migration tool, or "pglocks migrate". Retrying
	// cannot help (internal/outcome classifies it fatal).
	ErrNoTable = errors.New("lease: no lease table")

	// ErrNoPrivilege is wrapped, with the server's error (SQLSTATE 42501),
	// by the error of an operation the role may not run on the lease table
	// (or its schema): the error names the role, the table and the GRANT
	// that cures it. [Store.Migrate] needs CREATE on the schema;
	// [Lease.Guard] SELECT and UPDATE on the table for the role of the
	// caller's transaction (its error names the role its connection logs
	// in as); every other operation SELECT, INSERT and UPDATE for the
	// store pool's role. Only the server's refusal of the store's own
	// statement on the table or its schema is wrapped: a refusal inside a
	// trigger, or of another object (EXECUTE on pg_notify), is returned as
	// the server said it. Retrying cannot help.
	ErrNoPrivilege = errors.New("lease: missing privilege on the lease table")

	// ErrReadOnly is wrapped, with the server's error (SQLSTATE 25006), by
	// the error of an operation that writes (acquire, renew, release,
	// break, Migrate) when the pool reached a read-only server: a standby,
	// or a database or role with default_transaction_read_only on. Point
	// the pool at the primary; with several hosts in its DSN, add
	// target_session_attrs=read-write. Reads (Get, List, IsHeld) work
	// there. [Lease.Guard] wraps it too when the caller's transaction is
	// read-only (BEGIN READ ONLY), and says to begin it read-write.
	// Retrying cannot help.
	ErrReadOnly = errors.New("lease: the server is read-only")
)

// HeldError is the error of a [Store.TryAcquire] that found the lease held
// by another owner. errors.Is(err, ErrHeld) reports true for it.
type HeldError struct {
	// Name is the lease's name.
	Name string
	// Owner is the current holder.
	Owner uuid.UUID
	// Token is the current holder's fencing token.
	Token int64
	// ExpiresIn is how long the holder's lease had left by the server clock
	// when the try ran. The holder may renew or release it meanwhile.
	ExpiresIn time.Duration
	// Locked reports a name that had no live holder, but whose row stayed
	// locked by another transaction through several tries of
	// [Store.TryAcquireAll] (a Guard still open over the expired lease,
	// an acquisition not yet committed); Owner is then the zero UUID and
	// ExpiresIn 0.
	Locked bool
}

// Error describes the holder.
func (e *HeldError) Error() string {
	if e == nil {
		return "lease: nil *HeldError"
	}
	if e.Locked {
		return fmt.Sprintf("lease %q: not held (token %d), but its row stays locked by another transaction", e.Name, e.Token)
	}
	return fmt.Sprintf("lease %q: held by %s (token %d) for another %v",
		e.Name, e.Owner, e.Token, e.ExpiresIn.Round(time.Microsecond))
}

// Is reports whether target is [ErrHeld].
func (e *HeldError) Is(target error) bool { return target == ErrHeld }
