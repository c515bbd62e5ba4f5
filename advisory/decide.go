package advisory

import (
	"errors"
	"fmt"
	"time"

	"github.com/pglocks/pglocks/internal/outcome"
)

// This file is the one place where advisory decides what an error means
// for a lock: retry, return, or repair. The classes come from
// internal/outcome; what Unknown means for a session lock is decided here:
//
//   - A statement whose reply never came (timeout, reset, FATAL) leaves the
//     session's state unknown and the session itself gone or silent: the
//     session is closed, which frees everything it held on the server, and
//     its locks are announced lost. Nothing else can settle it.
//   - A statement the server answered with an error ran on a live session,
//     perhaps part-way: a session lock taken by a statement that then
//     failed is still held (session locks ignore rollback), and an unlock
//     that failed may have unlocked. The session's locks are read from
//     pg_locks and the Locker's state repaired to match (see settle);
//     the session is closed only when pg_locks cannot tell.
//   - A try that did nothing is then judged by its class: Busy waits or
//     reports ErrLocked, Retry is retried by waiting calls and returned by
//     tries, Fatal is returned at once — except a full lock table, which
//     is Retry but returned at once, named by ErrLockTableFull.

// verdict is what a session does with a statement's result.
type verdict uint8

const (
	verdictOK     verdict = iota // the server answered the statement
	verdictDead                  // the reply never came: close the session
	verdictSettle                // the server answered with an error: settle from pg_locks
)

// judge returns the verdict on a statement's reply and transport error.
func judge(rep *reply, err error) verdict {
	switch {
	case err != nil:
		return verdictDead
	case rep.pgErr != nil:
		return verdictSettle
	}
	return verdictOK
}

// step is what acquire does after one attempt that took no lock.
type step uint8

const (
	stepBusy   step = iota // the key is held: ErrLocked, or wait to be woken
	stepRetry              // nothing happened and another attempt may work
	stepReturn             // return the error
)

// decide returns the step for an attempt that took no lock and ended with
// err (nil: the key is busy). wait is true for Lock and RLock; retried
// counts the session deaths this call has already retried.
func decide(err error, wait bool, retried, maxSessions int) step {
	var de dialError
	switch {
	case err == nil:
		return stepBusy
	case errors.As(err, new(errAbandoned)), errors.Is(err, ErrClosed):
		return stepReturn
	case outcome.LockTableFull(err):
		// The server's lock table is full (see ErrLockTableFull): its
		// class is Retry, but a waiting call returns it rather than spin
		// silently while every client of the server fails the same way.
		return stepReturn
	case errors.Is(err, errSessionDied):
		// The session ended, freeing whatever it held: nothing is held
		// for this call. A try retries on another session, at most once
		// per session (an idle session's death goes unnoticed until used).
		if wait || retried < maxSessions {
			return stepRetry
		}
		return stepReturn
	case errors.As(err, &de):
		if wait && outcome.Of(de.err) != outcome.Fatal {
			return stepRetry // pickSession paces the dials
		}
		return stepReturn
	}
	switch outcome.Of(err) {
	case outcome.Busy:
		return stepBusy
	case outcome.Retry:
		if wait {
			return stepRetry
		}
	}
	return stepReturn
}

// dialError is the error of a session that could not be opened: err, from
// a dial that started at started and ended at ended, returned to a call
// that began at call.
type dialError struct {
	err                  error
	started, ended, call time.Time
}

// Error says "open session: " and the dial's error, and, when the dial
// ended or started before the call, that it did and how long before.
func (e dialError) Error() string {
	if !e.ended.IsZero() && e.ended.Before(e.call) {
		return fmt.Sprintf("open session: %v (the error of a dial that ended %v before this call, at %s)",
			e.err, e.call.Sub(e.ended).Round(time.Microsecond), e.ended.Format("15:04:05.000000"))
	}
	if !e.started.IsZero() && e.started.Before(e.call) {
		return fmt.Sprintf("open session: %v (the error of a dial that started %v before this call, at %s)",
			e.err, e.call.Sub(e.started).Round(time.Microsecond), e.started.Format("15:04:05.000000"))
	}
	return "open session: " + e.err.Error()
}

// Unwrap returns the dial's error.
func (e dialError) Unwrap() error { return e.err }
