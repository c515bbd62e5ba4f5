package lease

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/internal/outcome"
)

// observeAcquire logs and reports the end of an acquire call that started
// at start (a reading of Config.Now), and returns its result unchanged. A
// failed call is logged at Warn only when it begins a run of failures,
// and the acquisition that ends the run at Warn too (see internal/failrun
// and Config.Logger); the others at Debug. A call refused for the
// caller's input (outcome.Invalid: n above a semaphore's stored limit),
// and a call its caller cancelled (context.Canceled) before the server
// acquired anything, are logged at Debug and neither begin nor end a run:
// they say nothing about the server. A call cancelled after the server
// may have acquired (errUnknown: see ackedLate) has an unknown outcome,
// which is a failure like any other.
func (s *Store) observeAcquire(name string, wait bool, start time.Time, l *Lease, err error) (*Lease, error) {
	now := s.cfg.Now()
	elapsed := now.Sub(start)
	res := pglocks.ResultError
	switch {
	case err == nil:
		res = pglocks.ResultAcquired
		if n, d, ended := s.acquireFails.Succeed(s.cfg.Now); ended {
			s.cfg.Logger.Warn("lease: acquire succeeded again", "failures", n, "failing_for", d.Round(time.Millisecond),
				"lease", short(name), "token", l.token)
		}
		s.cfg.Logger.Debug("lease: acquired", "lease", short(name), "owner", l.owner, "token", l.token, "elapsed", elapsed)
	case errors.Is(err, ErrHeld), wait && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
		res = pglocks.ResultBusy
		s.cfg.Logger.Debug("lease: busy", "lease", short(name), "wait", wait, "elapsed", elapsed, "err", err)
	case outcome.Invalid(err):
		s.cfg.Logger.Debug("lease: acquire refused: invalid input", "lease", short(name), "wait", wait, "err", err)
	case errors.Is(err, context.Canceled) && !errors.Is(err, errUnknown):
		s.cfg.Logger.Debug("lease: acquire cancelled", "lease", short(name), "wait", wait, "elapsed", elapsed, "err", err)
	default:
		level, msg := s.acquireFails.Fail(now), "lease: acquire failed"
		if level >= slog.LevelWarn {
			msg += "; further failures are logged at Debug until an acquire succeeds"
		}
		s.cfg.Logger.Log(context.Background(), level, msg, "lease", short(name), "wait", wait, "elapsed", elapsed, "err", err)
	}
	if o := s.cfg.Observer; o != nil && o.Acquire != nil {
		o.Acquire(pglocks.AcquireEvent{Kind: pglocks.KindLease, Name: name, Wait: wait, Result: res, Elapsed: elapsed, Err: err})
	}
	return l, err
}

// observeStart reports a hold that begins now and returns its start.
func (s *Store) observeStart(name string, token int64) time.Time {
	if o := s.cfg.Observer; o != nil && o.Start != nil {
		o.Start(pglocks.HoldEvent{Kind: pglocks.KindLease, Name: name, Token: token})
	}
	return s.cfg.Now()
}

// observeEnd logs and reports the end of l's hold with cause err. l.mu is
// held.
func (l *Lease) observeEnd(err error, isLoss bool) {
	held := l.store.cfg.Now().Sub(l.at)
	reason := pglocks.ReasonReleased
	switch {
	case !isLoss && errors.Is(err, ErrReleased):
	case !isLoss:
		reason = pglocks.ReasonClosed
	case errors.Is(err, errUnknown):
		reason = pglocks.ReasonUnknown
	case errors.Is(err, ErrMaxHold):
		reason = pglocks.ReasonMaxHold
	case errors.Is(err, ErrNotHeld):
		reason = pglocks.ReasonNotHeld
	default:
		reason = pglocks.ReasonExpired
	}
	level := slog.LevelDebug
	if isLoss && !l.quietLoss {
		level = slog.LevelWarn
	}
	l.store.cfg.Logger.Log(context.Background(), level, "lease: "+string(reason), "lease", short(l.name),
		"owner", l.owner, "token", l.token, "held", held, "err", errIfLoss(err, isLoss))
	if o := l.store.cfg.Observer; o != nil && o.End != nil {
		o.End(pglocks.EndEvent{Kind: pglocks.KindLease, Name: l.name, Token: l.token, Reason: reason, Held: held, Err: errIfLoss(err, reason != pglocks.ReasonReleased)})
	}
}

func errIfLoss(err error, keep bool) error {
	if keep {
		return err
	}
	return nil
}

// observeRenew logs and reports a renewal that started at start and ended
// with err. A failed renewal is logged at Warn only when it begins a run
// of failures of the store's renewals, and the renewal that ends the run
// at Warn too; the others at Debug. A renewal the server answered "not
// held" is no failure of the store's renewals but the lease's loss, which
// observeEnd logs (at Warn, or at Debug for a lease acquired with
// internal/quietloss, whose holder logs it); and a renewal answered after
// the lease had ended here (it lapsed, say) changes nothing, its end
// being logged as such: both are logged at Debug and neither begins nor
// ends a run.
func (l *Lease) observeRenew(start time.Time, err error) {
	s := l.store
	now := s.cfg.Now()
	latency := now.Sub(start)
	if err == ErrNotHeld {
		s.cfg.Logger.Debug("lease: renew found it not held", "lease", short(l.name), "owner", l.owner, "token", l.token, "elapsed", latency)
	} else if errors.Is(err, ErrNotHeld) {
		s.cfg.Logger.Debug("lease: renew answered after the lease had ended", "lease", short(l.name), "owner", l.owner, "token", l.token, "elapsed", latency, "err", err)
	} else if err != nil {
		level, msg := s.renewFails.Fail(now), "lease: renew failed"
		if level >= slog.LevelWarn {
			msg += "; further failures are logged at Debug until a renewal succeeds"
		}
		s.cfg.Logger.Log(context.Background(), level, msg, "lease", short(l.name), "owner", l.owner, "token", l.token, "elapsed", latency, "err", err)
	} else {
		if n, d, ended := s.renewFails.Succeed(s.cfg.Now); ended {
			s.cfg.Logger.Warn("lease: renew succeeded again", "failures", n, "failing_for", d.Round(time.Millisecond),
				"lease", short(l.name), "token", l.token)
		}
		s.cfg.Logger.Debug("lease: renewed", "lease", short(l.name), "token", l.token, "elapsed", latency)
	}
	if o := s.cfg.Observer; o != nil && o.Renew != nil {
		o.Renew(pglocks.RenewEvent{Kind: pglocks.KindLease, Name: l.name, Token: l.token, Latency: latency, Err: err})
	}
}
