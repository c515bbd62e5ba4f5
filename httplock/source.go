package httplock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/lease"
)

// ErrBusy is wrapped by the error of [Source.Acquire] when another holder
// has the lock (and, for a waiting call, kept it until ctx ended).
var ErrBusy = errors.New("httplock: busy")

// BusyError is the error of a [Source.Acquire] that found the lock held.
// errors.Is(err, ErrBusy) reports true for it.
type BusyError struct {
	// Name is the lock's name.
	Name string
	// RetryAfter is how long the holder may keep the lock, when known
	// (a lease's time left), else 0.
	RetryAfter time.Duration
	// Err is the underlying error.
	Err error
}

func (e *BusyError) Error() string {
	if e == nil {
		return "httplock: nil *BusyError"
	}
	return fmt.Sprintf("httplock: %q is busy: %v", e.Name, e.Err)
}

// Is reports whether target is [ErrBusy].
func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// Unwrap returns the underlying error.
func (e *BusyError) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Err
}

// Held is one lock taken by a [Source]: the middleware releases it when
// the handler returns.
type Held interface {
	// Context is cancelled when the lock is lost (or released).
	Context() context.Context
	// Release gives the lock up; ctx bounds the wait.
	Release(ctx context.Context) error
}

// Source takes named locks for the middleware. [Advisory] and [Lease] are
// the two pglocks provides.
type Source interface {
	// Acquire takes the lock name. Without wait it tries once; with wait
	// it waits while the lock is held elsewhere, until ctx ends — an error
	// that waiting cannot cure (advisory.ErrLockTableFull, say) returns at
	// once. A lock held elsewhere is an error wrapping [ErrBusy], best a
	// [*BusyError]; any other error is a failure.
	Acquire(ctx context.Context, name string, wait bool) (Held, error)
}

// Advisory returns a Source of session advisory locks on
// pglocks.KeyOf(name), taken with l: the lock is held as long as the
// Locker's session lives, whatever the handler's duration.
func Advisory(l *advisory.Locker) Source { return advisorySource{l} }

type advisorySource struct{ l *advisory.Locker }

type advisoryHeld struct{ *advisory.Lock }

func (h advisoryHeld) Release(ctx context.Context) error { return h.Unlock(ctx) }

func (s advisorySource) Acquire(ctx context.Context, name string, wait bool) (Held, error) {
	key := pglocks.KeyOf(name)
	acquire := s.l.TryLock
	if wait {
		acquire = s.l.Lock
	}
	lk, err := acquire(ctx, key)
	switch {
	case err == nil:
		return advisoryHeld{lk}, nil
	case errors.Is(err, advisory.ErrLocked), wait && ctx.Err() != nil:
		return nil, &BusyError{Name: name, Err: err}
	}
	return nil, err
}

// Lease returns a Source of leases of s, each for ttl and kept alive while
// the handler runs. A busy answer carries the holder's time left as
// RetryAfter.
func Lease(s *lease.Store, ttl time.Duration) Source { return leaseSource{s, ttl} }

type leaseSource struct {
	s   *lease.Store
	ttl time.Duration
}

func (s leaseSource) Acquire(ctx context.Context, name string, wait bool) (Held, error) {
	acquire := s.s.TryAcquire
	if wait {
		acquire = s.s.Acquire
	}
	l, err := acquire(ctx, name, s.ttl, lease.WithKeepAlive())
	var held *lease.HeldError
	switch {
	case err == nil:
		return l, nil
	case errors.As(err, &held):
		return nil, &BusyError{Name: name, RetryAfter: held.ExpiresIn, Err: err}
	case wait && ctx.Err() != nil:
		return nil, &BusyError{Name: name, Err: err}
	}
	return nil, err
}
