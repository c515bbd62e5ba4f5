package lease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/pglocks/pglocks/internal/backoff"
	"github.com/pglocks/pglocks/internal/outcome"
	"github.com/pglocks/pglocks/internal/reach"
)

// Acquire acquires the lease name for ttl, waiting while another owner
// holds it, until it is acquired or ctx ends. A release wakes waiters at
// once (LISTEN/NOTIFY on Config.Channel, from one listening connection per
// store, opened on first need); a holder that vanishes without releasing is
// noticed when its lease expires — the wait lasts until the expiry reported
// by the failed try, plus a little jitter, and then tries again. There is
// no fixed-interval polling. An error that a later try may not meet (a
// restart, a dropped connection, a serialization failure) is retried with
// capped, jittered backoff, on the first try as on later ones; one that
// cannot pass (a closed pool, a missing table, no privilege) is returned at
// once. ctx bounds the whole wait; a cancelled wait leaves no row owned.
// Each try is bounded too, by ttl (at least 5 s): a try whose connection
// went silent (a partitioned primary) ends as an unknown outcome, is
// cleaned up, and the next try takes another connection.
//
// The Acquire calls of one name in one store queue first come, first
// served: only the head of the queue talks to the server, so a release
// wakes one waiter of the store, not all. A TryAcquire does not queue.
func (s *Store) Acquire(ctx context.Context, name string, ttl time.Duration, opts ...Option) (*Lease, error) {
	o, err := s.check(ctx, name, ttl, opts)
	if err != nil {
		return nil, wrapAcquire(name, err)
	}
	start := s.cfg.Now()
	l, err := s.acquire(ctx, name, ttl, o)
	return s.observeAcquire(name, true, start, l, err)
}

// acquire is Acquire after its input checks.
func (s *Store) acquire(ctx context.Context, name string, ttl time.Duration, o options) (*Lease, error) {
	return s.acquireBy(ctx, name, tryBound(ttl), func(ctx context.Context) (*Lease, error) { return s.try(ctx, name, ttl, o) })
}

// minTryBound is the least time one try of a waiting acquisition may take.
const minTryBound = 5 * time.Second

// tryBound bounds one try of a waiting acquisition of a lease of ttl,
// whatever the caller's ctx: the TTL, at least minTryBound. A try on a
// connection whose server went silent (a partitioned primary: no reply, no
// reset) would otherwise wait until the kernel gives up, some 15 minutes,
// while another host of the DSN could answer. A try cut off by the bound
// is an unknown outcome: cleaned up by its attempt id and tried again, on
// another connection (the cut one is closed).
func tryBound(ttl time.Duration) time.Duration { return max(ttl, minTryBound) }

// acquireBy is the wait of Acquire around try, which is [Store.try] or a
// try built on it (a shared lease's): the calls of one name (queue key)
// queue in the store, and a try that fails with a [*HeldError] waits for
// the release of the held name the error reports, or for its expiry.
func (s *Store) acquireBy(ctx context.Context, name string, bound time.Duration, try func(context.Context) (*Lease, error)) (*Lease, error) {
	t := s.queue(name)
	defer s.leave(name, t)
	if err := s.awaitTurn(ctx, t); err != nil {
		return nil, wrapAcquire(name, err)
	}
	var (
		lis   *listener
		w     *waiter
		wname string // the name w waits for
		bo    backoff.Backoff
	)
	defer func() {
		if w != nil {
			lis.unregister(wname, w)
		}
	}()
	for {
		tctx, cancel := context.WithTimeout(ctx, bound)
		l, err := try(tctx)
		cancel()
		var held *HeldError
		var wait time.Duration
		if errors.As(err, &held) {
			reach.Answered(ctx) // the server answered: the lease is held
		}
		switch {
		case err == nil:
			return l, nil
		case held != nil && w == nil:
			// Register, then try again: a release between the first try
			// and the registration would otherwise go unheard.
			if lis, err = s.listener(); err != nil {
				return nil, wrapAcquire(name, err)
			}
			wname = held.Name
			w = lis.register(wname)
			lis.awaitReady(ctx, w)
			if perr := s.stopped(ctx); perr != nil {
				return nil, wrapAcquire(name, perr) // do not try after Close woke us
			}
			continue
		case held != nil:
			wait = lis.pollWait(held.ExpiresIn + jitter(held.ExpiresIn))
			bo.Reset()
		case retryable(err) && ctx.Err() == nil:
			wait = bo.Next()
		default:
			return nil, wrapAcquire(name, err)
		}
		var wake <-chan struct{}
		if w != nil {
			wake = w.wake
		}
		if perr := s.park(ctx, wake, wait); perr != nil {
			if errors.Is(perr, ErrClosed) {
				return nil, wrapAcquire(name, perr)
			}
			return nil, fmt.Errorf("acquire lease %q: %w (%w)", short(name), perr, err)
		}
	}
}

// retryable reports whether a later acquire attempt may succeed where this
// one failed: nothing was done (Retry), or the outcome is unknown and the
// attempt is being cleaned up by its own id (Unknown).
func retryable(err error) bool {
	if errors.Is(err, ErrClosed) {
		return false
	}
	c := outcome.Of(err)
	return c == outcome.Retry || c == outcome.Unknown
}

// stopped returns ctx's cause or ErrClosed once either has ended.
func (s *Store) stopped(ctx context.Context) error {
	if s.ctx.Err() != nil {
		return ErrClosed
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return nil
}

// park waits for a wake-up, for wait to pass, for ctx (returning its
// cause) or for the store to close (ErrClosed).
func (s *Store) park(ctx context.Context, wake <-chan struct{}, wait time.Duration) error {
	t := time.NewTimer(wait)
	defer t.Stop()
	s.parked.Add(1)
	defer s.parked.Add(-1)
	select {
	case <-wake:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-s.ctx.Done():
		return ErrClosed
	}
}

func wrapAcquire(name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("acquire lease %q: %w", short(name), err)
}

// jitter spreads waiters that wake at one holder's expiry: 1 ms plus up to
// 5% of the wait, at most 50 ms.
func jitter(wait time.Duration) time.Duration {
	return time.Millisecond + rand.N(min(max(wait/20, time.Millisecond), 50*time.Millisecond))
}

// serialization reports a failure the server asks to retry at once
// (40001, 40P01): under serializable or repeatable read, racing updates of
// one row meet it; nothing was written.
func serialization(err error) bool {
	switch outcome.SQLState(err) {
	case "40001", "40P01":
		return true
	}
	return false
}

// retrySerialization runs f until it does not fail with a serialization
// failure, ctx ends, or 20 tries, with a short backoff between them.
func retrySerialization(ctx context.Context, f func() error) error {
	bo := backoff.Backoff{Min: time.Millisecond, Max: 50 * time.Millisecond}
	for i := 0; ; i++ {
		err := f()
		if !serialization(err) || i == 19 {
			return err
		}
		if werr := bo.Wait(ctx); werr != nil {
			return fmt.Errorf("%w (last error: %w)", werr, err)
		}
	}
}
