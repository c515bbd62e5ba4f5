// Package outcome classifies every error that pglocks meets on its way to
// the server — from pgx, pgconn, pgxpool/puddle, net and context — into the
// one question a lock library must answer about a request: did it happen?
//
// An operation that talks to the server has three results, not two: done,
// not done, or unknown. [Of] maps an error (the operation did not report
// done) to one of four classes:
//
//	class    what happened on the server               what the caller does
//	Busy     nothing; the lock or row is held          report "held", or wait
//	Retry    nothing; trying again may succeed         back off, try again
//	Fatal    nothing; trying again cannot help         return the error now
//	Unknown  the request was sent, no reply came:      end local trust, or settle
//	         the statement may have run and committed  the state by exact identity
//
// The table, and why each entry is where it is:
//
//	error                                  class    why
//	nil                                    OK
//	pgconn SafeToRetry (nothing was sent:  Retry    pgx guarantees no byte of the
//	  conn busy/closed before the write,             request reached the server
//	  ctx done before the write), except            (ReceiveMessage's errors are
//	  PgConn.ReceiveMessage's errors                 marked so though it was: Unknown)
//	*pgconn.ConnectError (dial, TLS,       by its   no statement was sent; the
//	  startup, authentication)             cause    cause decides (auth: Fatal)
//	puddle.ErrClosedPool ("closed pool")   Fatal    the caller's pool is closed
//	errors marked with [MarkFatal]         Fatal    e.g. a package's ErrClosed
//	errors marked with [MarkInvalid]       Fatal    the caller's input is bad
//	                                                 ([Invalid] reports them)
//	errors marked with [MarkNotSent]       Retry    never sent (a caller gave up
//	  that would be Unknown                          while its request waited in
//	                                                 a local queue)
//	PgError, severity ERROR: the statement's transaction aborted, so nothing
//	  it wrote committed; by SQLSTATE:
//	  55P03 lock_not_available             Busy     NOWAIT / lock_timeout met a holder
//	  40001 serialization_failure,         Retry    the server asks for a retry
//	  40P01 deadlock_detected
//	  57014 query_canceled                 Retry    our own timeout/cancel; the
//	                                                 transaction rolled back
//	  53xxx insufficient resources         Retry    too many connections, lock
//	                                                 table or memory full: may pass
//	                                                 (a full lock table is also
//	                                                 named by [LockTableFull])
//	  57P0x, 08xxx                         Retry    shutdown, startup, connection
//	  28xxx auth, 3D000 no database,       Fatal    configuration or schema: the
//	  42xxx undefined object/privilege,              same request fails again
//	  25006 read-only transaction,
//	  0A000 not supported, 22xxx data,
//	  any other SQLSTATE
//	PgError, severity FATAL or PANIC,      Unknown  the session ended while the
//	  after the request was sent                     statement ran; a commit may
//	                                                 have been flushed just before
//	                                                 (the reply was still buffered)
//	context.Canceled / DeadlineExceeded,   Unknown  the request may have run;
//	  net errors, io.EOF after the write             pgx closes the connection
//
// What Unknown means for safety is decided by each concept, once: advisory
// locks vanish with their session, so an Unknown on a session that is gone
// is "not held" and on a live session is settled from pg_locks; a lease
// write that may have committed ends local trust at once or is settled by a
// statement scoped to the exact acquisition (name, owner, token).
//
// The caller's own ctx is separate: Retry says another attempt may work,
// not that there is time for one.
package outcome

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
)

// Class is what an error says about the request that produced it.
type Class int

const (
	// OK: the request was done (the error was nil).
	OK Class = iota
	// Busy: nothing was done because the lock or row is held by another.
	Busy
	// Retry: nothing was done, and a later attempt may succeed.
	Retry
	// Fatal: nothing was done, and retrying cannot help.
	Fatal
	// Unknown: the request may or may not have run on the server.
	Unknown
)

// String names the class.
func (c Class) String() string {
	switch c {
	case OK:
		return "ok"
	case Busy:
		return "busy"
	case Retry:
		return "retry"
	case Fatal:
		return "fatal"
	case Unknown:
		return "unknown"
	}
	return "invalid"
}

// fatalMark wraps an error that is Fatal whatever it wraps.
type fatalMark struct{ err error }

func (f fatalMark) Error() string { return f.err.Error() }
func (f fatalMark) Unwrap() error { return f.err }

// MarkFatal returns err marked as Fatal for [Of], unchanged for errors.Is
// and errors.As. Packages mark their sentinels with it (ErrClosed, invalid
// input) so that the classifier needs no import of them.
func MarkFatal(err error) error {
	if err == nil {
		return nil
	}
	return fatalMark{err}
}

// invalidMark wraps an error about the caller's input.
type invalidMark struct{ err error }

func (m invalidMark) Error() string { return m.err.Error() }
func (m invalidMark) Unwrap() error { return m.err }

// MarkInvalid returns err marked as the caller's error — bad input (a
// permit count above the semaphore's limit, say), found before the
// request was sent or refused by the server for what was asked — for
// [Of] (Fatal) and [Invalid]; errors.Is and errors.As see err unchanged.
func MarkInvalid(err error) error {
	if err == nil {
		return nil
	}
	return fatalMark{invalidMark{err}}
}

// Invalid reports whether err was marked with [MarkInvalid]: the call
// failed because of what the caller asked, not because of the server or
// the network. Such a failure says nothing about the health of the
// calls, so observers do not count it in a run of failures (see
// internal/failrun) nor log it as one.
func Invalid(err error) bool {
	var m invalidMark
	return errors.As(err, &m)
}

// notSentMark wraps an error of a request that was never sent.
type notSentMark struct{ err error }

// Error is the wrapped error's message.
func (n notSentMark) Error() string { return n.err.Error() }

// Unwrap returns the wrapped error.
func (n notSentMark) Unwrap() error { return n.err }

// MarkNotSent returns err marked as never sent: [Of] classifies it as
// Retry where it would say Unknown (a context error, say), and as it would
// otherwise (Fatal for a closed pool or a refused password); errors.Is and
// errors.As see err unchanged. A caller that gave up while its request
// waited in a local queue, or that got no connection to send it on, marks
// the error with it.
func MarkNotSent(err error) error {
	if err == nil {
		return nil
	}
	return notSentMark{err}
}

// Of classifies err; see the package doc for the table.
func Of(err error) Class {
	c := of(err)
	var nm notSentMark
	if c == Unknown && errors.As(err, &nm) {
		return Retry
	}
	return c
}

func of(err error) Class {
	if err == nil {
		return OK
	}
	var fm fatalMark
	if errors.As(err, &fm) || errors.Is(err, puddle.ErrClosedPool) {
		return Fatal
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return connectClass(err)
	}
	// pgx marks every error of the low-level PgConn.ReceiveMessage safe to
	// retry, although the request it answers was sent: not safe here.
	if pgconn.SafeToRetry(err) && !strings.Contains(err.Error(), "receive message failed") {
		return Retry
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		if pe.Severity == "FATAL" || pe.Severity == "PANIC" {
			return Unknown
		}
		return Code(pe.Code)
	}
	return Unknown
}

// connectClass classifies an error met while opening a connection: no
// statement was sent, so the cause only decides between Retry and Fatal.
func connectClass(err error) Class {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		if c := Code(pe.Code); c != Busy {
			return c
		}
		return Retry
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return Retry
	}
	return Retry // refused, unreachable, reset, DNS, TLS handshake: may pass
}

// Code classifies a SQLSTATE reported with severity ERROR (the statement's
// transaction rolled back).
func Code(code string) Class {
	switch {
	case code == "55P03":
		return Busy
	case code == "40001", code == "40P01", code == "57014",
		strings.HasPrefix(code, "53"), strings.HasPrefix(code, "57P"), strings.HasPrefix(code, "08"):
		return Retry
	}
	return Fatal
}

// LockTableFull reports whether err says that the server's shared lock
// table is full: SQLSTATE 53200 (out_of_memory) with PostgreSQL's hint to
// raise max_locks_per_transaction, the error of any statement or
// connection that needs one more entry in the table (a lock that does not
// fit in the backend's fast-path slots: advisory locks, locks on shared
// catalogs, transaction ids). The statement failed and took nothing; its
// class stays [Retry], since entries are freed as locks are released: what
// a caller does about a full table is its own decision. Other 53200 errors
// (a backend out of memory) are not this.
func LockTableFull(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "53200" && strings.Contains(pe.Hint, "max_locks_per_transaction")
}

// SQLState returns err's SQLSTATE, or "" when err carries none.
func SQLState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}
