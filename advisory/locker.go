package advisory

import (
	"context"
	"errors"
	"fmt"
	"github.com/pglocks/pglocks/internal/failrun"
	"sync"
	"time"

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
	poolCfg *pgxpool.Config // a copy: ConnConfig and the connect hooks

	ctx     context.Context // cancelled by Close: dials, listener
	cancel  context.CancelFunc
	closing chan struct{}
	wg      sync.WaitGroup

	mu         sync.Mutex
	closed     bool
	keys       map[keyID]*keyState
	asks       map[keyID]time.Time // recent asks for keys not held here (see markContended)
	asksPruned time.Time           // the last sweep of asks
	sessions   []*session
	dialing    int
	dial       dialState
	changed    chan struct{} // closed and replaced when sessions change or a dial ends
	listens    bool          // the listener was started
	ownPIDs    map[uint32]bool
	closeErr   error

	ev    events      // for the Logger and Observer, outside mu (see events)
	fails failrun.Run // the acquire calls failing now, for the Logger

	closeOnce sync.Once

	engine engineCheck // the proof that the server's locks exclude
}

var errNilContext = errors.New("nil context")

// New returns a Locker that opens its sessions the way pool opens its
// connections (pool.Config(): its ConnConfig, BeforeConnect and
// AfterConnect), as configured by cfg (see [Config] for the defaults). New
// opens no connection: the first lock asked for opens the first session,
// more are opened as needed, and once a session is open one more
// connection LISTENs for wake-ups.
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
		poolCfg: pool.Config(),
		ctx:     ctx,
		cancel:  cancel,
		closing: make(chan struct{}),
		keys:    map[keyID]*keyState{},
		asks:    map[keyID]time.Time{},
		changed: make(chan struct{}),
		ownPIDs: map[uint32]bool{},
	}
	return l, nil
}

// Config returns the locker's configuration, defaults filled in (the zero
// Config for a nil *Locker).
func (l *Locker) Config() Config {
	if l == nil {
		return Config{}
	}
	return l.cfg
}

// TryLock takes the exclusive lock on key if it is free, in one round trip
// (plus, when no session is open, the dial of one), and fails with an error
// wrapping [ErrLocked] if another session holds it, or another holder in
// this process holds or waits for it. Any other error is a real failure,
// never "busy": the cause of a dial that failed (at once, without waiting
// for ctx: a dial this call made, one under way that it shared, or one
// that ended less than 25 ms before the call began, whose error says so;
// see "When the database is unavailable" in the package doc), or a
// transport or server error. ctx bounds the call.
func (l *Locker) TryLock(ctx context.Context, key pglocks.Key) (*Lock, error) {
	return l.acquire(ctx, "trylock", key, false, false)
}

// Lock takes the exclusive lock on key, waiting until it is free or ctx
// ends. It waits through outages and the death of the sessions it tries on,
// and returns at once on an error that retrying cannot cure (see "When the
// database is unavailable" in the package doc) and when the server's lock
// table is full ([ErrLockTableFull]). Waiting never blocks a session: Lock retries a non-blocking try when
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

var errNilLocker = errors.New("nil *Locker (make one with advisory.New)")

// check turns bad input into an error naming the problem.
func (l *Locker) check(ctx context.Context, key pglocks.Key) error {
	switch {
	case l == nil:
		return errNilLocker
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
	switch {
	case l == nil:
		return fmt.Errorf("advisory: close: %w", errNilLocker)
	case l.closing == nil:
		return errors.New("advisory: close: zero Locker (make one with advisory.New)")
	case ctx == nil:
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
