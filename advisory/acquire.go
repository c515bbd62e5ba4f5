package advisory

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/internal/backoff"
	"github.com/pglocks/pglocks/internal/reach"
)

// attempt is one TryLock, Lock, TryRLock or RLock call: it holds the key's
// in-process reservation from the start and tries on a session until it
// takes the lock or [decide] says to return.
type attempt struct {
	l      *Locker
	ctx    context.Context
	key    pglocks.Key
	id     keyID
	shared bool
	wait   bool
	call   call   // when the call began, for pickSession
	m      *multi // TryLockAll, LockAll, a Semaphore: several keys at once (see multi.go)

	got   *Lock   // the lock taken
	taken []*Lock // m's locks taken

	waker   chan struct{} // signalled when a holder unlocks the key
	asked   time.Time     // when a failed try last asked holders to notify
	woken   bool          // woken by an unlock since it last asked
	last    error         // why the latest retried attempt failed
	retried int           // failed attempts retried so far
	busy    time.Duration // the next delay before polling a busy key
	bo      backoff.Backoff
}

func (l *Locker) acquire(ctx context.Context, op string, key pglocks.Key, shared, wait bool) (*Lock, error) {
	if err := l.check(ctx, key); err != nil {
		return nil, opErr(op, key, err)
	}
	id, start, c := idOf(key), time.Now(), l.beginCall()
	if err := l.reserve(ctx, id, shared, wait); err != nil {
		return l.observeAcquire(key, shared, wait, start, nil, opErr(op, key, err))
	}
	a := &attempt{l: l, ctx: ctx, key: key, id: id, shared: shared, wait: wait, call: c, busy: l.cfg.MinBackoff}
	err := a.run()
	return l.observeAcquire(key, shared, wait, start, a.got, opErr(op, key, err))
}

// run tries until the lock is taken (a.got, or a.taken for a multi) or
// decide says to return.
func (a *attempt) run() error {
	for {
		if a.wait {
			a.waker = a.l.addWaker(a.ids()...)
		}
		ask := a.wait && a.shouldAsk()
		ok, err := a.once(ask)
		if ok {
			a.dropWaker()
			return nil
		}
		var delay time.Duration
		switch decide(err, a.wait, a.retried, a.l.cfg.MaxSessions) {
		case stepReturn:
			return a.giveUp(err)
		case stepBusy:
			reach.Answered(a.ctx) // the server answered: the key is held
			if !a.wait {
				if a.m == nil {
					a.l.unreserve(a.id, a.shared)
				}
				return ErrLocked
			}
			if ask {
				a.asked, a.woken = time.Now(), false
			}
			delay = jitter(a.busy)
			a.busy = min(2*a.busy, a.l.cfg.MaxBackoff)
		case stepRetry:
			a.last, a.retried = err, a.retried+1
			delay = a.retryDelay(err)
		}
		if err := a.pause(delay); err != nil {
			return a.giveUp(err)
		}
	}
}

// askInterval is how often a waiting Lock that was not woken asks the
// holders again (see shouldAsk).
const askInterval = 2 * time.Second

// shouldAsk reports whether the next try, if it fails, asks the key's
// holders by NOTIFY to notify its unlock. Every listener of the channel
// receives every such event, so a waiter asks only when it may be needed:
// on its first failed try; on the first after a wake-up (the key was
// unlocked, so a failed try means a new holder, which has not heard it);
// and then every askInterval, for a holder that missed it (its listener
// was down). In between, the holder keeps the request: its unlock
// notifies. A request that is lost costs latency only: the waiter polls
// every MaxBackoff at most.
func (a *attempt) shouldAsk() bool {
	return a.asked.IsZero() || a.woken || time.Since(a.asked) >= askInterval
}

// once makes one try on a session, asking holders to notify if ask and it
// fails: true when it took the lock, false and nil when the key is busy,
// or why the try failed.
func (a *attempt) once(ask bool) (bool, error) {
	if a.m != nil {
		return a.onceAll(ask)
	}
	s, err := a.l.pickSession(a.ctx, a.wait, a.call)
	if err != nil {
		return false, err
	}
	r := newRequest(opTry, a.key, a.shared)
	r.want = ask
	ran, err := s.runDirect(a.ctx, r)
	if !ran {
		err = s.submit(a.ctx, r)
	}
	if err != nil {
		return false, err // abandoned or the session stopped: r is not ours
	}
	a.got = r.got
	return r.got != nil, r.err
}

// retryDelay is the pause before retrying after err. Dials are paced by
// pickSession; the first retry after a session's death is immediate (it
// died unnoticed, another one will do), later ones back off.
func (a *attempt) retryDelay(err error) time.Duration {
	if errors.As(err, new(dialError)) || a.retried == 1 {
		return 0
	}
	return a.bo.Next()
}

// pause waits d, or until the key's holder unlocks it, ctx ends or the
// Locker closes; it returns ctx's cause or ErrClosed then.
func (a *attempt) pause(d time.Duration) error {
	if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-a.waker:
			a.busy, a.woken = a.l.cfg.MinBackoff, true
		case <-t.C:
		case <-a.ctx.Done():
		case <-a.l.closing:
		}
		t.Stop()
	}
	a.dropWaker()
	if a.ctx.Err() != nil {
		return context.Cause(a.ctx)
	}
	if a.l.isClosed() {
		return ErrClosed
	}
	return nil
}

func (a *attempt) dropWaker() {
	if a.waker != nil {
		a.l.removeWaker(a.waker, a.ids()...)
		a.waker = nil
	}
}

// ids returns the keys the attempt waits for.
func (a *attempt) ids() []keyID {
	if a.m == nil {
		return []keyID{a.id}
	}
	ids := make([]keyID, 0, len(a.m.keys)+1)
	for _, k := range a.m.keys {
		ids = append(ids, idOf(k))
	}
	if a.m.turnstile.Space() != 0 {
		ids = append(ids, idOf(a.m.turnstile))
	}
	return ids
}

// giveUp ends the call with err: it gives back the reservation (unless an
// abandoned request still carries it) and says that ctx ended and why the
// last retried attempt failed.
func (a *attempt) giveUp(err error) error {
	a.dropWaker()
	abandoned := errors.As(err, new(errAbandoned))
	if !abandoned && a.m == nil {
		a.l.unreserve(a.id, a.shared)
	}
	if a.ctx.Err() == nil {
		return err
	}
	if cause := context.Cause(a.ctx); !abandoned && err != cause {
		err = fmt.Errorf("%w (and: %w)", cause, err)
	}
	if a.last != nil && a.last != err {
		err = fmt.Errorf("%w (last error: %w)", err, a.last)
	}
	return err
}

// jitter returns a random duration in [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}
