package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// keepAlive is the background renewal of one lease.
type keepAlive struct {
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

func (k *keepAlive) signalStop() { k.stopOnce.Do(func() { close(k.stop) }) }

// wait waits for the keep-alive goroutine to end, or ctx.
func (k *keepAlive) wait(ctx context.Context) error {
	select {
	case <-k.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for keep-alive: %w", context.Cause(ctx))
	}
}

// startKeepAlive starts the renewal goroutine. l.mu must be held.
func (l *Lease) startKeepAlive() {
	ka := &keepAlive{stop: make(chan struct{}), done: make(chan struct{})}
	l.ka = ka
	l.store.wg.Add(1)
	go l.runKeepAlive(ka)
}

// runKeepAlive renews every TTL × RenewFraction and, in between, checks
// the row every Config.CheckInterval. After a transient error it retries
// sooner, with backoff, for as long as the lease is trusted; the trust
// timer declares the loss if no renewal succeeds in time. Each statement
// is bounded by the trust deadline, so a hung connection cannot hold the
// keep-alive past it.
func (l *Lease) runKeepAlive(ka *keepAlive) {
	defer l.store.wg.Done()
	defer close(ka.done)
	cfg := l.store.cfg
	interval := cfg.renewInterval(l.ttl)
	minBackoff := max(interval/16, time.Millisecond)
	backoff := minBackoff
	lastRenew := cfg.Now()
	t := time.NewTimer(min(interval, cfg.CheckInterval))
	defer t.Stop()
	for {
		select {
		case <-ka.stop:
			return
		case <-t.C:
		}
		now := cfg.Now()
		left := l.TrustedUntil().Sub(now)
		if left <= 0 {
			return // the trust timer declares the loss
		}
		renew := now.Sub(lastRenew) >= interval-interval/64 || backoff > minBackoff
		ctx, cancel := context.WithTimeout(context.Background(), left)
		var err error
		if renew {
			err = l.renew(ctx)
		} else {
			err = l.check(ctx)
		}
		cancel()
		next := min(interval, cfg.CheckInterval)
		switch {
		case err == nil:
			if renew {
				lastRenew, backoff = now, minBackoff
			}
			next = min(next, max(interval-cfg.Now().Sub(lastRenew), time.Millisecond))
		case errors.Is(err, ErrNotHeld), errors.Is(err, ErrClosed):
			return
		default:
			next, backoff = backoff, min(2*backoff, interval)
		}
		t.Reset(next)
	}
}

// check asks the server whether the lease is still held, writing nothing;
// if it is not, the lease is lost.
func (l *Lease) check(ctx context.Context) error {
	if err := l.live(); err != nil {
		return err
	}
	var left int64
	err := noRows(l.store.pool.QueryRow(ctx, l.store.q.assertSQL, l.args()...).Scan(&left))
	if err == ErrNotHeld {
		l.mu.Lock()
		releasing := l.releasing
		l.mu.Unlock()
		if !releasing {
			l.lose("check")
		}
	}
	return err
}

// Do acquires the lease name for ttl (waiting as [Store.Acquire] does),
// runs fn with a context that is cancelled if the lease is lost, renews
// the lease in the background meanwhile, and releases it when fn returns
// (or panics) — also when ctx is cancelled, on a context detached from ctx
// and bounded by ttl. It returns fn's error; if the lease was lost while fn
// ran, the error also wraps [ErrLost], since fn may then not have been
// alone.
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
		if lerr := l.Err(); errors.Is(lerr, ErrLost) {
			rerr = lerr // the loss, not the failed release, is the news
		}
		err = errors.Join(err, rerr)
	}()
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(l.Context(), func() { cancel(context.Cause(l.Context())) })
	defer stop()
	return fn(fctx)
}
