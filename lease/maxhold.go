package lease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrMaxHold is wrapped, with [ErrLost], by the cause of the Context of a
// Lease that reached the maximum hold set by [WithMaxHold].
var ErrMaxHold = errors.New("lease: max hold reached")

// WithMaxHold limits how long one Lease is held: d after the Lease was made
// (its acquisition, or the Resume that made it in this store), the lease
// ends as lost — [Lease.Lost] closes, [Lease.Context] is cancelled with a
// cause wrapping [ErrLost] and [ErrMaxHold] — its keep-alive stops, and
// the store releases its row in the background, as it does after a
// release whose outcome is unknown, so that the next acquirer gets the
// name at once rather than at the row's expiry. A holder that is wedged
// in its work, its keep-alive still renewing, so loses the name after d
// instead of keeping it for ever. It applies to any lease (kept alive or
// not, shared ones, Store.Do), and is meant for kept-alive ones. d must be
// positive; a d shorter than the TTL is allowed (the lease then ends
// before its first renewal). The limit is local to this Lease: Resume of
// its Handle in another store, which starts a new Lease, starts a new
// limit (or none), and Resume of a live Lease in the same store keeps the
// Lease's own.
func WithMaxHold(d time.Duration) Option {
	return func(o *options) { o.maxHold, o.hasMaxHold = d, true }
}

// checkMaxHold refuses a WithMaxHold that is not positive.
func (o options) checkMaxHold() error {
	if o.hasMaxHold && o.maxHold <= 0 {
		return fmt.Errorf("lease: WithMaxHold: %v is not positive", o.maxHold)
	}
	return nil
}

// limitHold ends the lease d from now (see WithMaxHold). l.mu is held and
// the caller is inside enter/exit.
func (l *Lease) limitHold(d time.Duration) {
	l.hold = time.AfterFunc(d, func() { l.maxHeld(d) })
}

// maxHeld ends the lease at its maximum hold d and releases its row in the
// background once no renewal of it is under way (a renewal that committed
// after the release would hold the row again).
func (l *Lease) maxHeld(d time.Duration) {
	s := l.store
	if s.enter() != nil {
		return // closed: the store abandons its leases
	}
	defer s.exit()
	l.mu.Lock()
	ka := l.ka
	ended := !l.releasing && l.end(fmt.Errorf("%w: lease %q: held for %v: %w; it is released in the background", ErrLost, short(l.name), d, ErrMaxHold), true)
	l.mu.Unlock()
	if !ended {
		return // released, lost or being released meanwhile
	}
	name, owner, token := l.name, l.owner, l.token
	s.releaseInBackground(l.Handle(), l.ttl, func(ctx context.Context) error {
		if ka != nil {
			if err := ka.wait(ctx); err != nil {
				return err
			}
		}
		return s.releaseRow(ctx, name, owner, token)
	})
}
