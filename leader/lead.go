package leader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// lead runs one term: the work, the renewals, and the watch for its end.
// It returns the reason the term ended, after stepping down.
func (e *Elector) lead(ctx context.Context, t *tenure, work func(context.Context, Term) error, hooks *dispatcher) error {
	e.mu.Lock()
	e.current = t
	e.mu.Unlock()
	e.cfg.Logger.Info("leader: elected", "election", e.cfg.Name, "identity", e.cfg.Identity, "term", t.term.Number)
	if e.cfg.OnElected != nil {
		term := t.term
		hooks.do(func() { e.cfg.OnElected(term) })
	}
	if e.cfg.OnNewLeader != nil {
		l := Leader{Election: e.cfg.Name, Held: true, Identity: e.cfg.Identity, Term: t.term.Number,
			Since: t.term.Since, Expiry: t.lease.ExpiresAt()}
		hooks.do(func() { e.cfg.OnNewLeader(l) })
	}

	// Cancelled only here, always with the reason (ErrStopped when ctx ends).
	workCtx, cancelWork := context.WithCancelCause(context.WithoutCancel(ctx))
	workDone := make(chan error, 1)
	if time.Now().Before(t.term.TrustedUntil()) {
		go func() { workDone <- work(workCtx, t.term) }()
	} else {
		// Elected, but stalled past the trust deadline already (a starved
		// process): step down without starting the work.
		workDone <- nil
	}
	renewCtx, stopRenew := context.WithCancel(context.Background())
	renewDone := make(chan struct{})
	go func() { defer close(renewDone); e.renew(renewCtx, t) }()

	reason, workErr, returned := e.watch(ctx, t, workDone)
	cancelWork(reason)
	if !returned {
		workErr = <-workDone
	}
	stopRenew()
	<-renewDone
	if workErr != nil && !errors.Is(workErr, context.Canceled) && !errors.Is(workErr, reason) {
		e.cfg.Logger.Warn("leader: work returned an error", "election", e.cfg.Name, "term", t.term.Number, "err", workErr)
	}
	e.stepDown(t)
	e.mu.Lock()
	e.current = nil
	e.mu.Unlock()
	close(t.done)
	e.cfg.Logger.Info("leader: demoted", "election", e.cfg.Name, "term", t.term.Number, "reason", reason)
	if e.cfg.OnDemoted != nil {
		term := t.term
		hooks.do(func() { e.cfg.OnDemoted(term, reason) })
	}
	return reason
}

// watch waits for the end of the term and returns why, with the work's
// result if the work returned.
func (e *Elector) watch(ctx context.Context, t *tenure, workDone <-chan error) (reason, workErr error, returned bool) {
	timer := time.NewTimer(time.Until(t.term.TrustedUntil()))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrStopped, context.Cause(ctx)), nil, false
		case <-t.resign:
			return ErrResigned, nil, false
		case err := <-workDone:
			return ErrWorkDone, err, true
		case <-t.lock.Lost():
			return fmt.Errorf("%w: advisory session ended: %w", ErrLost, t.lock.Err()), nil, false
		case <-t.lease.Context().Done():
			// Every end of the lease: lost, broken, or abandoned by a Store
			// closed under us (which does not close Lost).
			return fmt.Errorf("%w: %w", ErrLost, context.Cause(t.lease.Context())), nil, false
		case <-timer.C:
			until := t.term.TrustedUntil()
			if left := time.Until(until); left > 0 {
				timer.Reset(left)
				continue
			}
			return fmt.Errorf("%w: trust deadline passed (renewals or session checks did not succeed in time)", ErrLost), nil, false
		}
	}
}

// renew renews the lease every RenewInterval, retrying sooner after a
// failure, each attempt bounded by the trust deadline. The lease itself
// declares the loss when its trust deadline passes; a renewal that finds
// the lease gone ends it at once.
func (e *Elector) renew(ctx context.Context, t *tenure) {
	wait := e.cfg.RenewInterval
	for sleep(ctx, wait) {
		left := time.Until(t.lease.TrustedUntil())
		if left <= 0 {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, left)
		err := t.lease.Renew(rctx)
		cancel()
		switch {
		case err == nil:
			wait = e.cfg.RenewInterval
		case errors.Is(err, lease.ErrNotHeld), errors.Is(err, lease.ErrLost), errors.Is(err, lease.ErrClosed):
			return
		default:
			e.cfg.Logger.Warn("leader: renew failed; retrying", "election", e.cfg.Name, "term", t.term.Number, "err", err)
			wait = max(e.cfg.RenewInterval/4, 10*time.Millisecond)
		}
	}
}

// stepDown releases the lease, then the advisory lock, with a fresh bounded
// context: a candidate woken by the unlock finds the lease free. A term no
// longer trusted unlocks first: its release may be what is failing, and a
// candidate should not have to terminate a shared session to get past it.
func (e *Elector) stepDown(t *tenure) {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RetryInterval+5*time.Second)
	defer cancel()
	trusted := t.lease.Err() == nil && time.Now().Before(t.term.TrustedUntil())
	if !trusted {
		e.unlock(t.lock)
	}
	if err := t.lease.Release(ctx); err != nil && !errors.Is(err, lease.ErrNotHeld) && !errors.Is(err, lease.ErrLost) {
		e.cfg.Logger.Warn("leader: release lease", "election", e.cfg.Name, "term", t.term.Number, "err", err)
	}
	if trusted {
		e.unlock(t.lock)
	}
	e.notify(ctx)
}
