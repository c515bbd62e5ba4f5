package advisory

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
)

// Locker takes session advisory locks on a few dedicated sessions, opened
// with the connection settings of a pool but never returned to it. Make one
// with [New] and share it: a Locker is safe for concurrent use, and excludes
// its own holders from each other as well as from other sessions.
type Locker struct {
	pool    *pgxpool.Pool
	cfg     Config
	connCfg *pgconn.Config

	ctx     context.Context // cancelled by Close: dials, listener
	cancel  context.CancelFunc
	closing chan struct{}
	wg      sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	keys     map[keyID]*keyState
	sessions []*session
	dialing  int
	dialErr  error
	changed  chan struct{} // closed and replaced when sessions change
	ownPIDs  map[uint32]bool
	closeErr error

	closeOnce sync.Once
}

var errNilContext = errors.New("nil context")

// New returns a Locker that opens its sessions with pool's connection
// settings (pool.Config().ConnConfig), as configured by cfg (see [Config]
// for the defaults). It opens no connection itself: sessions are opened as
// locks are taken, and one more connection listens for wake-ups.
//
// Session locks need a real session: behind PgBouncer (or another pooler)
// in transaction mode they are unsafe. Use [XactLock] there.
func New(pool *pgxpool.Pool, cfg Config) (*Locker, error) {
	if pool == nil {
		return nil, errors.New("advisory: New: nil pool")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Locker{
		pool:    pool,
		cfg:     cfg,
		connCfg: pool.Config().ConnConfig.Config.Copy(),
		ctx:     ctx,
		cancel:  cancel,
		closing: make(chan struct{}),
		keys:    map[keyID]*keyState{},
		changed: make(chan struct{}),
		ownPIDs: map[uint32]bool{},
	}
	l.wg.Add(1)
	go l.listen()
	return l, nil
}

// Config returns the locker's configuration, defaults filled in.
func (l *Locker) Config() Config { return l.cfg }

// TryLock takes the exclusive lock on key if it is free, in one round trip,
// and fails with an error wrapping [ErrLocked] if another session holds it,
// or another holder in this process holds or waits for it. Any other error
// is a real failure (transport, server), never "busy". ctx bounds the call.
func (l *Locker) TryLock(ctx context.Context, key pglocks.Key) (*Lock, error) {
	return l.acquire(ctx, "trylock", key, false, false)
}

// Lock takes the exclusive lock on key, waiting until it is free or ctx
// ends. Waiting never blocks a session: Lock retries a non-blocking try when
// a pglocks holder anywhere unlocks the key (LISTEN/NOTIFY), else with
// jittered backoff from MinBackoff to MaxBackoff (see [Config]), so a lock
// freed by a crashed holder is picked up too. When ctx ends first, Lock
// returns ctx's error at once and leaves no lock and no server-side waiter
// behind: a try already on the wire is undone when its answer arrives, so
// for up to that one round trip the key may still be held (and TryLock in
// this process still reports it busy).
func (l *Locker) Lock(ctx context.Context, key pglocks.Key) (*Lock, error) {
	return l.acquire(ctx, "lock", key, false, true)
}

// TryRLock is [Locker.TryLock] for the shared lock: readers coexist, and a
// writer excludes them (pg_try_advisory_lock_shared).
func (l *Locker) TryRLock(ctx context.Context, key pglocks.Key) (*Lock, error) {
	return l.acquire(ctx, "tryrlock", key, true, false)
}

// RLock is [Locker.Lock] for the shared lock. A waiting writer in this
// process stops later readers of this process, so writers do not starve.
func (l *Locker) RLock(ctx context.Context, key pglocks.Key) (*Lock, error) {
	return l.acquire(ctx, "rlock", key, true, true)
}

// check turns bad input into an error naming the problem.
func (l *Locker) check(ctx context.Context, key pglocks.Key) error {
	switch {
	case l == nil:
		return errors.New("nil *Locker (make one with advisory.New)")
	case ctx == nil:
		return errNilContext
	case l.isClosed():
		return ErrClosed
	}
	if err := key.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("context already done: %w", context.Cause(ctx))
	}
	return nil
}

func (l *Locker) acquire(ctx context.Context, op string, key pglocks.Key, shared, wait bool) (*Lock, error) {
	if err := l.check(ctx, key); err != nil {
		return nil, opErr(op, key, err)
	}
	id := idOf(key)
	if err := l.reserve(ctx, id, shared, wait); err != nil {
		return nil, opErr(op, key, err)
	}
	backoff := l.cfg.MinBackoff
	var last error
	retries := 0
	for {
		var waker chan struct{}
		if wait {
			waker = l.addWaker(id)
		}
		r := newRequest(opTry, key, shared)
		r.want = wait
		var got *Lock
		s, err := l.pickSession(ctx)
		if err == nil {
			var ran bool
			if ran, err = s.runDirect(ctx, r); !ran {
				err = s.submit(ctx, r)
			}
			if err == nil { // r is done, not abandoned: its fields are ours
				got, err = r.got, r.err
			}
		}
		if got != nil && err == nil {
			if waker != nil {
				l.removeWaker(id, waker)
			}
			return got, nil
		}
		if err != nil && !wait && retries < l.cfg.MaxSessions && errors.Is(err, errSessionDied) && ctx.Err() == nil {
			// The session died unnoticed (it held no locks, so nobody
			// pinged it): try again, on another one.
			retries++
			continue
		}
		var ab errAbandoned
		abandoned := errors.As(err, &ab)
		if err == nil && !wait {
			l.unreserve(id, shared)
			return nil, opErr(op, key, ErrLocked)
		}
		if err != nil && (!wait || ctx.Err() != nil || errors.Is(err, ErrClosed) || isPgError(err)) {
			if waker != nil {
				l.removeWaker(id, waker)
			}
			if !abandoned {
				l.unreserve(id, shared)
			}
			if ctx.Err() != nil && !abandoned {
				// Say that ctx ended, whatever else went wrong.
				err = fmt.Errorf("%w (and: %w)", context.Cause(ctx), err)
			}
			if last != nil && ctx.Err() != nil {
				err = fmt.Errorf("%w (last error: %w)", err, last)
			}
			return nil, opErr(op, key, err)
		}
		if err != nil {
			last = err // a session died or could not be opened: retry
		}
		t := time.NewTimer(jitter(backoff))
		backoff = min(2*backoff, l.cfg.MaxBackoff)
		select {
		case <-waker:
			backoff = l.cfg.MinBackoff
		case <-t.C:
		case <-ctx.Done():
		case <-l.closing:
		}
		t.Stop()
		l.removeWaker(id, waker)
		err = ctx.Err()
		if err == nil && l.isClosed() {
			err = ErrClosed
		}
		if err != nil {
			l.unreserve(id, shared)
			if err != ErrClosed {
				err = context.Cause(ctx)
			}
			if last != nil {
				err = fmt.Errorf("%w (last error: %w)", err, last)
			}
			return nil, opErr(op, key, err)
		}
	}
}

// jitter returns a random duration in [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

func isPgError(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe)
}

func (l *Locker) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// Close releases every lock held through l (each one's [Lock.Lost] fires,
// with [Lock.Err] wrapping [ErrClosed]), closes the sessions and the
// listener, makes waiting calls return [ErrClosed], and waits for all of
// l's goroutines. A lock whose session could not release it is announced
// lost ([ErrLost]) and the error says so. Close is idempotent; ctx bounds
// only the wait, and the release goes on in the background if it ends.
func (l *Locker) Close(ctx context.Context) error {
	if ctx == nil {
		return errors.New("advisory: close: nil context")
	}
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		close(l.closing)
		l.cancel()
	})
	done := make(chan struct{})
	go func() {
		l.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("advisory: close: %w", context.Cause(ctx))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closeErr
}

func (l *Locker) addCloseErr(err error) {
	l.mu.Lock()
	l.closeErr = errors.Join(l.closeErr, err)
	l.mu.Unlock()
}
