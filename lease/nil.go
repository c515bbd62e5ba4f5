package lease

import (
	"context"
	"errors"

	"github.com/pglocks/pglocks/internal/outcome"
)

// Errors of methods called on a nil or zero Store or Lease: no panic, an
// error naming the problem (TestMethods in internal/nilsafe). A nil *Lease
// is what TryAcquire returns with an error, so a deferred Release of it
// must not panic.
var (
	errNilStore  = outcome.MarkFatal(errors.New("lease: nil *Store (make one with lease.New)"))
	errZeroStore = outcome.MarkFatal(errors.New("lease: zero Store (make one with lease.New)"))
	errNilLease  = outcome.MarkFatal(errors.New("lease: nil *Lease (no lease was acquired: check the acquire error)"))
	errZeroLease = outcome.MarkFatal(errors.New("lease: zero Lease (leases come from a Store's TryAcquire, Acquire or Resume)"))
)

// usable returns nil for a Store made by New, else why it cannot be used.
func (s *Store) usable() error {
	switch {
	case s == nil:
		return errNilStore
	case s.ctx == nil:
		return errZeroStore
	}
	return nil
}

// usable returns nil for a Lease made by a Store, else why it cannot be
// used.
func (l *Lease) usable() error {
	switch {
	case l == nil:
		return errNilLease
	case l.store == nil:
		return errZeroLease
	}
	return nil
}

// endedContext returns a context cancelled with cause err: the Context of
// a nil or zero Lease.
func endedContext(err error) context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(err)
	return ctx
}

// noLost is the Lost channel of a nil or zero Lease: closed, since such a
// Lease holds nothing.
var noLost = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()
