package leader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// lead runs one term: the work, the renewals, and the watch for its end.
// It returns the reason the term ended, after stepping down and after the
// work returned. A term that is lost steps down at once, before the work
// has returned; a term that ends otherwise (Resign, Run's ctx) lets the
// work finish under it first.
func (e *Elector) lead(ctx context.Context, t *tenure, work func(context.Context, Term) error, hooks *dispatcher) error {
	e.cfg.Logger.Info("leader: elected", "election", e.cfg.Name, "identity", e.cfg.Identity, "term", t.term.Number)
	e.observeTerm(t.term.Number, true, nil)
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
	renewCtx, stopRenew := context.WithCancel(context.Background())
	renewDone := make(chan struct{})
	go func() { defer close(renewDone); e.renew(renewCtx, t) }()
	stopTend, waitTend := e.startTending(t) // the candidacy's database calls, off the watch

	reason, workErr, returned := e.preflight(ctx, t), error(nil), true
	if reason == nil {
		go func() { workDone <- work(workCtx, t.term) }()
		reason, workErr, returned = e.watch(ctx, t, workDone)
	}
	cancelWork(reason)
	stopTend()
	if !returned && !errors.Is(reason, ErrLost) {
		// Resigning or stopping: the term is still ours until the work
		// returns, unless it is lost meanwhile.
		workErr, returned = e.drain(t, workDone)
	}
	stopRenew()
	<-renewDone
	if returned {
		e.reserve(t, reason)
	}
	e.stepDown(t)
	waitTend()
	t.endTerm(reason)
	e.mu.Lock()
	e.current = nil
	e.mu.Unlock()
	close(t.done)
	e.cfg.Logger.Info("leader: demoted", "election", e.cfg.Name, "term", t.term.Number, "reason", reason)
	e.observeTerm(t.term.Number, false, reason)
	if e.cfg.OnDemoted != nil {
		term := t.term
		hooks.do(func() { e.cfg.OnDemoted(term, reason) })
	}
	if !returned {
		e.cfg.Logger.Warn("leader: stepped down; waiting for the work to return before campaigning again",
			"election", e.cfg.Name, "term", t.term.Number)
		workErr = <-workDone
	}
	if workErr != nil && !errors.Is(workErr, context.Canceled) && !errors.Is(workErr, reason) {
		e.cfg.Logger.Warn("leader: work returned an error", "election", e.cfg.Name, "term", t.term.Number, "err", workErr)
	}
	return reason
}

// preflight returns why a term just won must not start its work, or nil:
// Run's ctx ended, it was resigned, its advisory lock or lease is already
// known lost, or its trust deadline passed while the process was stalled.
func (e *Elector) preflight(ctx context.Context, t *tenure) error {
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrStopped, context.Cause(ctx))
	case <-t.resign:
		return t.why
	default:
	}
	switch {
	case t.lockErr() != nil:
		return fmt.Errorf("%w: advisory session ended: %w", ErrLost, t.lockErr())
	case t.lease.Err() != nil:
		return fmt.Errorf("%w: %w", ErrLost, t.lease.Err())
	case !time.Now().Before(t.term.TrustedUntil()):
		return fmt.Errorf("%w: trust deadline passed before the work started (a stalled process)", ErrLost)
	}
	return nil
}

// drain waits for the work to return while the term is still held; it
// gives up, so that the caller steps down at once, when the term is lost.
func (e *Elector) drain(t *tenure, workDone <-chan error) (workErr error, returned bool) {
	timer := time.NewTimer(time.Until(t.term.TrustedUntil()))
	defer timer.Stop()
	for {
		select {
		case err := <-workDone:
			return err, true
		case <-t.lockLost():
			return nil, false
		case <-t.lease.Context().Done():
			return nil, false
		case <-t.term.lapse.done():
			return nil, false
		case <-timer.C:
			left := time.Until(t.term.TrustedUntil())
			if left <= 0 {
				return nil, false
			}
			timer.Reset(left)
		}
	}
}

// errLapsed is why a term whose trust deadline passed ended.
var errLapsed = fmt.Errorf("%w: trust deadline passed (renewals or session checks did not succeed in time)", ErrLost)

// watch waits for the end of the term and returns why, with the work's
// result if the work returned. It makes no database call: whatever it
// waits for is a channel or a timer, so that the term's loss is acted on
// at once (requests are answered by tend, which closes t.resign).
func (e *Elector) watch(ctx context.Context, t *tenure, workDone <-chan error) (reason, workErr error, returned bool) {
	timer := time.NewTimer(time.Until(t.term.TrustedUntil()))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrStopped, context.Cause(ctx)), nil, false
		case <-t.resign:
			return t.why, nil, false
		case err := <-workDone:
			return ErrWorkDone, err, true
		case <-t.lockLost():
			return fmt.Errorf("%w: advisory session ended: %w", ErrLost, t.lockErr()), nil, false
		case <-t.lease.Context().Done():
			// Every end of the lease: lost, broken, or abandoned by a Store
			// closed under us (which does not close Lost).
			return fmt.Errorf("%w: %w", ErrLost, context.Cause(t.lease.Context())), nil, false
		case <-t.term.lapse.done():
			return errLapsed, nil, false
		case <-timer.C:
			until := t.term.TrustedUntil()
			if left := time.Until(until); left > 0 {
				timer.Reset(left)
				continue
			}
			return errLapsed, nil, false
		}
	}
}

// renew watches the renewals of the term's lease, which its Store's
// keep-alive sends — one statement per round for every kept-alive lease of
// the Store, this term's among them — and sends none of its own. The lease
// declares the loss itself (its trust deadline passed, or a renewal or
// check found its row gone), which watch and drain see on the lease's
// Context. Here the elector only reports, in State.LastError and once per
// run at Warn, a lease whose last confirmed renewal is more than two
// renewal intervals old: the keep-alive is retrying, and the term ends at
// its trust deadline unless a renewal succeeds first.
func (e *Elector) renew(ctx context.Context, t *tenure) {
	every, late := e.cfg.RenewInterval, false
	for sleep(ctx, every) {
		if t.lease.Err() != nil {
			return
		}
		// The send time of the last confirmed renewal (or of the
		// acquisition), on the Store's clock, as its trust deadline says.
		last := t.lease.TrustedUntil().Add(-(e.cfg.TTL - e.margin))
		age := e.storeNow().Sub(last)
		switch {
		case age <= 2*every:
			late = false
		case !late:
			late = true
			err := fmt.Errorf("leader: term %d: its lease was last renewed %v ago (the Store's keep-alive renews every %v and is retrying; the term ends at its trust deadline unless a renewal succeeds first)",
				t.term.Number, age.Round(time.Millisecond), every)
			e.setErr(err)
			e.cfg.Logger.Warn("leader: renewals overdue", "election", e.cfg.Name, "term", t.term.Number, "err", err)
		}
	}
}

// lockLost is the term's advisory lock's Lost, nil (never ready) for a
// lease-only term.
func (t *tenure) lockLost() <-chan struct{} {
	if t.lock == nil {
		return nil
	}
	return t.lock.Lost()
}

// lockErr is the term's advisory lock's Err, nil for a lease-only term.
func (t *tenure) lockErr() error {
	if t.lock == nil {
		return nil
	}
	return t.lock.Err()
}

// stepDown releases the lease, then the advisory lock (if any), with a
// fresh bounded context: a candidate woken by the unlock finds the lease
// free. A term no
// longer trusted unlocks first: its release may be what is failing, and a
// candidate should not have to terminate a shared session to get past it.
func (e *Elector) stepDown(t *tenure) {
	ctx, cancel := e.stmt(context.Background())
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
