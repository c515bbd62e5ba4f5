// Package lockstmt writes the calls of PostgreSQL's advisory-lock
// functions that pglocks sends, in one place: the advisory Locker
// prepares them, the transaction and on-connection locks send them, and
// the engine probe (internal/engine) runs the very same texts to prove
// that they exclude.
//
// Every call names its function pg_catalog-qualified and types its key
// parameters explicitly ($1::int8, or $1::int4, $2::int4). An unqualified
// call resolves through the session's search_path, which a schema put
// before pg_catalog can use to replace the function; and a parameter left
// untyped lets PostgreSQL pick any overload of the name it can reach, so an
// overload taking float8 in public wins over pg_catalog's bigint function
// (float8 is the preferred type of the numeric category). Qualified and
// typed, a call reaches the server's own function and no other. A test in
// the root package fails on any advisory-lock call in pglocks' Go sources
// that is not pg_catalog-qualified.
package lockstmt

// Fn is a pg_catalog-qualified advisory-lock function.
type Fn string

// The functions pglocks calls.
const (
	TryLock           Fn = "pg_catalog.pg_try_advisory_lock"
	TryLockShared     Fn = "pg_catalog.pg_try_advisory_lock_shared"
	Lock              Fn = "pg_catalog.pg_advisory_lock"
	LockShared        Fn = "pg_catalog.pg_advisory_lock_shared"
	Unlock            Fn = "pg_catalog.pg_advisory_unlock"
	UnlockShared      Fn = "pg_catalog.pg_advisory_unlock_shared"
	TryXactLock       Fn = "pg_catalog.pg_try_advisory_xact_lock"
	TryXactLockShared Fn = "pg_catalog.pg_try_advisory_xact_lock_shared"
	XactLock          Fn = "pg_catalog.pg_advisory_xact_lock"
)

// UnlockAll releases every session advisory lock of the session.
const UnlockAll = "select pg_catalog.pg_advisory_unlock_all()"

// Try returns the try function of a session lock, shared or exclusive.
func Try(shared bool) Fn {
	if shared {
		return TryLockShared
	}
	return TryLock
}

// Release returns the unlock function of a session lock, shared or
// exclusive.
func Release(shared bool) Fn {
	if shared {
		return UnlockShared
	}
	return Unlock
}

// TryXact returns the try function of a transaction lock.
func TryXact(shared bool) Fn {
	if shared {
		return TryXactLockShared
	}
	return TryXactLock
}

// Args returns the typed key parameters: "$1::int8", or "$1::int4,
// $2::int4" for a pair key; and the number of the next parameter.
func Args(pair bool) (string, int) {
	if pair {
		return "$1::int4, $2::int4", 3
	}
	return "$1::int8", 2
}

// Call returns the call of fn on the key parameters (see [Args]).
func Call(fn Fn, pair bool) string {
	args, _ := Args(pair)
	return string(fn) + "(" + args + ")"
}

// Select returns the statement "select <fn>(<key parameters>)": the
// Locker's plain try and unlock statements, and the on-connection and
// transaction locks' statements.
func Select(fn Fn, pair bool) string { return "select " + Call(fn, pair) }
