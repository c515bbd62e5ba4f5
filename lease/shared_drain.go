package lease

import (
	"context"
	"time"

	"github.com/pglocks/pglocks/internal/backoff"
)

// drain waits until no reader holds rw, for the writer l, which holds rw's
// writer row and so keeps new readers out. A release of a reader's slot
// wakes it through the store's listener (each live slot's name is
// registered, on one wake channel); a reader that vanished is waited out
// until its slot's expiry. Without a keep-alive, l is renewed whenever
// half its TTL has passed. If ctx ends, l is lost or an error cannot be
// retried, l is given back.
func (s *Store) drain(ctx context.Context, rw string, l *Lease) (*Lease, error) {
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(l.Context(), func() { cancel(context.Cause(l.Context())) })
	defer stop()
	d := drainer{s: s, wake: make(chan struct{}, 1), ws: make(map[string]*waiter)}
	defer d.close()
	var bo backoff.Backoff
	for {
		rs, err := s.readers(wctx, rw)
		var wait time.Duration
		switch {
		case err == nil && len(rs) == 0:
			return l, nil
		case err == nil:
			added, lerr := d.listen(wctx, rs)
			if lerr != nil {
				return nil, giveBack(ctx, l, nil, lerr)
			}
			if added {
				continue // a release before the registration was not heard: look again
			}
			h := longest(rs)
			wait = d.lis.pollWait(h.ExpiresIn + jitter(h.ExpiresIn))
			bo.Reset()
		case retryable(err) && wctx.Err() == nil:
			wait = bo.Next()
		default:
			return nil, giveBack(ctx, l, nil, err)
		}
		if err := s.waitDraining(wctx, l, d.wake, wait); err != nil {
			return nil, giveBack(ctx, l, nil, err)
		}
	}
}

// waitDraining parks for wait or a wake-up, renewing l first when it has
// no keep-alive and half its TTL has passed (and parking no longer than
// until the next such renewal).
func (s *Store) waitDraining(ctx context.Context, l *Lease, wake <-chan struct{}, wait time.Duration) error {
	if due, manual := l.renewDue(); manual {
		if due <= 0 {
			// A renewal that may pass later is retried at the next turn;
			// the trust deadline ends l if none passes in time.
			if err := l.Renew(ctx); err != nil && (l.Err() != nil || !retryable(err)) {
				return err
			}
			due, _ = l.renewDue()
		}
		wait = min(wait, max(due, 50*time.Millisecond))
	}
	return s.park(ctx, wake, wait)
}

// renewDue returns how long until l, renewed by hand, is half-way through
// its trust window; manual is false when l has a keep-alive.
func (l *Lease) renewDue() (due time.Duration, manual bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ka != nil {
		return 0, false
	}
	return l.trustUntil.Sub(l.store.cfg.Now()) - l.ttl/2, true
}

// drainer holds a writer's registrations with the store's listener: one
// waiter per reader slot seen live, all on one wake channel.
type drainer struct {
	s    *Store
	lis  *listener
	wake chan struct{}
	ws   map[string]*waiter
}

// listen registers the slots of rs not registered yet, waits until their
// interest is settled (see awaitReady), and reports whether it registered
// any.
func (d *drainer) listen(ctx context.Context, rs []*HeldError) (bool, error) {
	if d.lis == nil {
		lis, err := d.s.listener()
		if err != nil {
			return false, err
		}
		d.lis = lis
	}
	var added []*waiter
	for _, h := range rs {
		if d.ws[h.Name] == nil {
			w := d.lis.add(h.Name, &waiter{wake: d.wake, ready: make(chan struct{})})
			d.ws[h.Name] = w
			added = append(added, w)
		}
	}
	d.awaitReady(ctx, added)
	return len(added) > 0, nil
}

// awaitReady is listener.awaitReady for many waiters at once: it waits
// until each one's interest is settled, for one second at most in all.
func (d *drainer) awaitReady(ctx context.Context, ws []*waiter) {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for _, w := range ws {
		select {
		case <-w.ready:
		case <-t.C:
			return
		case <-ctx.Done():
			return
		case <-d.s.ctx.Done():
			return
		}
	}
}

func (d *drainer) close() {
	for name, w := range d.ws {
		d.lis.unregister(name, w)
	}
}
