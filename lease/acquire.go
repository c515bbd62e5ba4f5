package lease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
)

// Acquire acquires the lease name for ttl, waiting while another owner
// holds it, until it is acquired or ctx ends. A release wakes waiters at
// once (LISTEN/NOTIFY on Config.Channel, from one listening connection per
// store, opened on first need); a holder that vanishes without releasing is
// noticed when its lease expires — the wait lasts until the expiry reported
// by the failed try, plus a little jitter, and then tries again. There is
// no fixed-interval polling. ctx bounds the whole wait; a cancelled wait
// leaves no row owned.
func (s *Store) Acquire(ctx context.Context, name string, ttl time.Duration, opts ...Option) (*Lease, error) {
	o, err := s.check(name, ttl, opts)
	if err != nil {
		return nil, fmt.Errorf("acquire lease %q: %w", name, err)
	}
	l, err := s.try(ctx, name, ttl, o)
	var held *HeldError
	if !errors.As(err, &held) {
		return l, wrapAcquire(name, err)
	}
	lis, err := s.listener()
	if err != nil {
		return nil, wrapAcquire(name, err)
	}
	w := lis.register(name)
	defer lis.unregister(name, w)
	lis.awaitReady(ctx, w)
	backoff := time.Duration(0)
	for {
		// Try again once registered: a release between the first try and
		// the registration would otherwise go unheard.
		l, err = s.try(ctx, name, ttl, o)
		var wait time.Duration
		switch {
		case errors.As(err, &held):
			wait, backoff = held.ExpiresIn+jitter(held.ExpiresIn), 0
		case transient(err) && ctx.Err() == nil:
			// A restart or a dropped connection: keep waiting. A failed
			// attempt may have left a cleanup of its owner's row running:
			// the next attempt must not share that owner.
			if !o.hasOwner {
				id, uerr := uuid.NewRandom()
				if uerr != nil {
					return nil, wrapAcquire(name, uerr)
				}
				o.owner = id
			}
			backoff = min(max(2*backoff, 10*time.Millisecond), time.Second)
			wait = backoff + jitter(backoff)
		default:
			return l, wrapAcquire(name, err)
		}
		if perr := s.park(ctx, w.wake, wait); perr != nil {
			if errors.Is(perr, ErrClosed) {
				return nil, wrapAcquire(name, perr)
			}
			return nil, fmt.Errorf("acquire lease %q: %w (%w)", name, perr, err)
		}
	}
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
	return fmt.Errorf("acquire lease %q: %w", name, err)
}

// jitter spreads waiters that wake at one holder's expiry: 1 ms plus up to
// 5% of the wait, at most 50 ms.
func jitter(wait time.Duration) time.Duration {
	return time.Millisecond + rand.N(min(max(wait/20, time.Millisecond), 50*time.Millisecond))
}

// transient reports whether err is a connection failure or a server
// shutting down or starting up, which a later attempt may not meet.
func transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P")
	}
	return !errors.Is(err, ErrClosed) && !errors.Is(err, ErrInvalidTTL) && !errors.Is(err, ErrInvalidConfig)
}

// ambiguous reports whether err leaves it unknown whether a statement
// committed: not a server error, and the statement may have been sent.
func ambiguous(err error) bool {
	var pgErr *pgconn.PgError
	return err != nil && !errors.As(err, &pgErr) && !pgconn.SafeToRetry(err)
}

// cleanup frees a lease that an interrupted acquire may have taken, in the
// background — Close waits for it — or, with wait, before it returns. The
// release matches (name, owner): a background cleanup is safe only for an
// owner id that no later acquisition uses (a fresh one per attempt).
func (s *Store) cleanup(name string, owner uuid.UUID, ttl time.Duration, wait bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return // nobody waits for it; the row expires at the end of its TTL
	}
	s.wg.Add(1)
	done := make(chan struct{})
	go func() {
		defer s.wg.Done()
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), min(ttl, 10*time.Second))
		defer cancel()
		_, _ = s.pool.Exec(ctx, s.q.releaseOwnerSQL, name, pgUUID(owner), s.q.channel, interestKey(s.q.channel, name)) // best effort
	}()
	if wait {
		s.mu.Unlock()
		<-done
		s.mu.Lock()
	}
}
