package advisory

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/internal/outcome"
)

// observeAcquire logs and reports the end of an acquire call that started
// at start, and returns its result unchanged. A failed call is logged at
// Warn only when it begins a run of failures, and the acquisition that
// ends the run at Warn too (see internal/failrun and Config.Logger); the
// others at Debug; a call refused for the caller's input
// (outcome.Invalid) at Debug, outside any run. The report is queued after the hold's Start (see [events]) and
// delivered before the call returns unless another goroutine is
// delivering; no lock is held.
func (l *Locker) observeAcquire(key pglocks.Key, shared, wait bool, start time.Time, lk *Lock, err error) (*Lock, error) {
	o := l.cfg.Observer
	res := acquireResult(err, wait)
	level := slog.LevelDebug
	var failures int64
	var failing time.Duration
	switch res {
	case pglocks.ResultError:
		if !outcome.Invalid(err) {
			level = l.fails.Fail(time.Now())
		}
	case pglocks.ResultAcquired:
		var ended bool
		if failures, failing, ended = l.fails.Succeed(time.Now); ended {
			level = slog.LevelWarn
		}
	}
	log := l.cfg.Logger
	if !log.Enabled(context.Background(), level) && (o == nil || o.Acquire == nil) {
		return lk, err // nobody listens: skip the clock and the key's formatting
	}
	elapsed := time.Since(start)
	var pid uint32
	if lk != nil {
		pid = lk.pid
	}
	l.post(func() {
		switch res {
		case pglocks.ResultAcquired:
			if failures > 0 {
				log.Warn("advisory: acquire succeeded again", "failures", failures, "failing_for", failing.Round(time.Millisecond),
					"key", key.String(), "pid", pid)
			}
			log.Debug("advisory: acquired", "key", key.String(), "shared", shared, "pid", pid, "elapsed", elapsed)
		case pglocks.ResultBusy:
			log.Debug("advisory: busy", "key", key.String(), "shared", shared, "wait", wait, "elapsed", elapsed, "err", err)
		default:
			msg := "advisory: acquire failed"
			if outcome.Invalid(err) {
				msg = "advisory: acquire refused: invalid input"
			} else if level >= slog.LevelWarn {
				msg += "; further failures are logged at Debug until an acquire succeeds"
			}
			log.Log(context.Background(), level, msg, "key", key.String(), "shared", shared, "wait", wait, "elapsed", elapsed, "err", err)
		}
		if o != nil && o.Acquire != nil {
			o.Acquire(pglocks.AcquireEvent{Kind: pglocks.KindAdvisory, Name: key.String(), Shared: shared,
				Wait: wait, Result: res, Elapsed: elapsed, Err: err})
		}
	})
	l.deliver()
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

// observeStart queues the report of a hold that begins now (see [events])
// and returns its start.
func (l *Locker) observeStart(key pglocks.Key, obs string) time.Time {
	if o := l.cfg.Observer; o != nil && o.Start != nil {
		l.post(func() { o.Start(pglocks.HoldEvent{Kind: pglocks.KindAdvisory, Name: obsName(key, obs)}) })
	}
	return time.Now()
}

// observeEnd queues the log and report of the end of lk's hold (see
// [events]): l.mu is held, and often the session's mu.
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
	log, o := lk.l.cfg.Logger, lk.l.cfg.Observer
	logs := log.Enabled(context.Background(), level)
	if !logs && (o == nil || o.End == nil) {
		return
	}
	key, pid, obs := lk.key, lk.pid, lk.obs
	lk.l.post(func() {
		if logs {
			log.Log(context.Background(), level, "advisory: "+string(reason),
				"key", key.String(), "pid", pid, "held", held, "err", err)
		}
		if o != nil && o.End != nil {
			o.End(pglocks.EndEvent{Kind: pglocks.KindAdvisory, Name: obsName(key, obs), Reason: reason, Held: held, Err: err})
		}
	})
}

// obsName is the Observer's name of a hold of key: obs if set (a
// Semaphore's permits are reported under the semaphore's name), else the
// key.
func obsName(key pglocks.Key, obs string) string {
	if obs != "" {
		return obs
	}
	return key.String()
}
