package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// keepAlive is the background renewal of one lease, done by its store's
// renewer (see renewer.go) together with every other kept-alive lease of
// the store.
type keepAlive struct {
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{} // closed once the renewer let go of the lease

	// Owned by the renewer (under renewer.mu).
	due       time.Time     // next renewal
	contact   time.Time     // last confirmed renewal or check
	backoff   time.Duration // after a failed renewal; 0 when none
	fallback  bool          // a renewal of its own is under way
	interval  time.Duration
	doneClose sync.Once
}

func (k *keepAlive) signalStop() { k.stopOnce.Do(func() { close(k.stop) }) }

func (k *keepAlive) stopped() bool {
	select {
	case <-k.stop:
		return true
	default:
		return false
	}
}

func (k *keepAlive) finish() { k.doneClose.Do(func() { close(k.done) }) }

// wait waits until the renewer no longer renews the lease, or ctx.
func (k *keepAlive) wait(ctx context.Context) error {
	select {
	case <-k.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for keep-alive: %w", context.Cause(ctx))
	}
}

// startKeepAlive hands the lease to the store's renewer. l.mu must be
// held, and the caller be inside enter/exit (so that the renewer may be
// started).
func (l *Lease) startKeepAlive() {
	now := l.store.cfg.Now()
	every := l.store.cfg.renewInterval(l.ttl)
	ka := &keepAlive{stop: make(chan struct{}), done: make(chan struct{}),
		due: now.Add(every), contact: now, interval: every}
	l.ka = ka
	l.store.keepAlive(l, ka)
}

// renewed applies a confirmed renewal sent at sent, with the server's
// expiry exp and lag (see trustStart): the trust deadline moves to the
// renewal's start + TTL − margin if that is later. A lease whose passed
// deadline was read (TrustedUntil) or acted on (the timer) has ended, and
// stays so.
func (l *Lease) renewed(sent time.Time, exp time.Time, lag time.Duration) error {
	start := trustStart(sent, lag, l.store.cfg.Now())
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return l.endedErr()
	}
	if t := start.Add(l.ttl - l.store.cfg.margin(l.ttl)); t.After(l.trustUntil) {
		l.trustUntil = t
		l.expiresAt = exp
	}
	return nil
}

// notHeld ends the lease after the server said (name, owner, token) does
// not hold it, unless a Release is under way, whose answer decides.
func (l *Lease) notHeld(op string) {
	l.mu.Lock()
	releasing := l.releasing
	l.mu.Unlock()
	if !releasing {
		l.lose(op)
	}
}

// Do acquires the lease name for ttl (waiting as [Store.Acquire] does),
// runs fn with a context that is cancelled if the lease is lost, renews
// the lease in the background meanwhile, and releases it when fn returns
// (or panics) — also when ctx is cancelled, on a context detached from ctx
// and bounded by ttl. It returns fn's error; if the lease was lost while fn
// ran, the error also wraps [ErrLost], since fn may then not have been
// alone: one error, on one line, that says the loss first and wraps
// both (errors.Is finds fn's error and ErrLost, ErrMaxHold, …). A
// release that could not be sent is not Do's error: the Lease has ended
// all the same, and the release goes on in the background (see
// [Lease.Release]; the store logs it at Warn), so nothing keeps the name.
func (s *Store) Do(ctx context.Context, name string, ttl time.Duration, fn func(ctx context.Context) error, opts ...Option) (err error) {
	if fn == nil {
		return fmt.Errorf("do lease %q: nil function", short(name))
	}
	if err := checkCtx(ctx); err != nil {
		return fmt.Errorf("do lease %q: %w", short(name), err)
	}
	l, err := s.Acquire(ctx, name, ttl, append(opts, WithKeepAlive())...)
	if err != nil {
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl)
		defer cancel()
		rerr := l.Release(rctx)
		switch lerr := l.Err(); {
		case errors.Is(lerr, ErrLost):
			rerr = lerr // the loss, not the failed release, is the news
		case errors.Is(rerr, ErrReleased):
			rerr = nil // not sent: it goes on in the background
		}
		err = joinLoss(err, rerr)
	}()
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(l.Context(), func() { cancel(context.Cause(l.Context())) })
	defer stop()
	return fn(fctx)
}

// joinLoss is Do's error: fn's error err and the lease's end rerr (its
// loss, or a failed release), either of them nil, or one error wrapping
// both — the end first, as fn's error is often only its consequence (a
// cancelled context).
func joinLoss(err, rerr error) error {
	switch {
	case rerr == nil:
		return err
	case err == nil:
		return rerr
	}
	return fmt.Errorf("%w (fn returned: %w)", rerr, err)
}
