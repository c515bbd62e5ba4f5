package advisory

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/pglocks/pglocks"
)

// observeAcquire logs and reports the end of an acquire call that started
// at start, and returns its result unchanged.
func (l *Locker) observeAcquire(key pglocks.Key, shared, wait bool, start time.Time, lk *Lock, err error) (*Lock, error) {
	o := l.cfg.Observer
	res := acquireResult(err, wait)
	level := slog.LevelDebug
	if res == pglocks.ResultError {
		level = slog.LevelWarn
	}
	log := l.cfg.Logger
	if !log.Enabled(context.Background(), level) && (o == nil || o.Acquire == nil) {
		return lk, err // nobody listens: skip the clock and the key's formatting
	}
	elapsed := time.Since(start)
	switch res {
	case pglocks.ResultAcquired:
		log.Debug("advisory: acquired", "key", key.String(), "shared", shared, "pid", lk.pid, "elapsed", elapsed)
	case pglocks.ResultBusy:
		log.Debug("advisory: busy", "key", key.String(), "shared", shared, "wait", wait, "elapsed", elapsed, "err", err)
	default:
		log.Warn("advisory: acquire failed", "key", key.String(), "shared", shared, "wait", wait, "elapsed", elapsed, "err", err)
	}
	if o != nil && o.Acquire != nil {
		o.Acquire(pglocks.AcquireEvent{Kind: pglocks.KindAdvisory, Name: key.String(), Shared: shared,
			Wait: wait, Result: res, Elapsed: elapsed, Err: err})
	}
	return lk, err
}

// acquireResult classifies an acquire call's error: busy when the key was
// held (a try) or a waiting call's ctx ended first.
func acquireResult(err error, wait bool) pglocks.Result {
	switch {
	case err == nil:
		return pglocks.ResultAcquired
	case errors.Is(err, ErrLocked):
		return pglocks.ResultBusy
	case wait && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
		return pglocks.ResultBusy
	}
	return pglocks.ResultError
}

// observeStart reports a hold that begins now and returns its start.
func (l *Locker) observeStart(key pglocks.Key) time.Time {
	if o := l.cfg.Observer; o != nil && o.Start != nil {
		o.Start(pglocks.HoldEvent{Kind: pglocks.KindAdvisory, Name: key.String()})
	}
	return time.Now()
}

// observeEnd logs and reports the end of lk's hold. l.mu is held.
func (lk *Lock) observeEnd(st lockState, err error) {
	held := time.Since(lk.at)
	reason := pglocks.ReasonReleased
	switch st {
	case lockClosed:
		reason = pglocks.ReasonClosed
	case lockLost:
		reason = pglocks.ReasonSessionDied
	}
	level := slog.LevelDebug
	if reason.Lost() {
		level = slog.LevelWarn
	}
	if log := lk.l.cfg.Logger; log.Enabled(context.Background(), level) {
		log.Log(context.Background(), level, "advisory: "+string(reason),
			"key", lk.key.String(), "pid", lk.pid, "held", held, "err", err)
	}
	if o := lk.l.cfg.Observer; o != nil && o.End != nil {
		o.End(pglocks.EndEvent{Kind: pglocks.KindAdvisory, Name: lk.key.String(), Reason: reason, Held: held, Err: err})
	}
}
