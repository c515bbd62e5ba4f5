package lease

import (
	"context"
	"errors"
	"fmt"
	"github.com/pglocks/pglocks/internal/failrun"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/internal/outcome"
)

// Store acquires and inspects leases in one lease table through a pool. It
// is safe for concurrent use. Make it with [New]; Close it when done.
type Store struct {
	pool modalPool // the caller's, in a pooler-safe exec mode
	cfg  Config
	q    queries
	mq   multiQueries // TryAcquireAll's and semaphores' (multi_sql.go)

	ctx       context.Context // cancelled by Close
	stop      context.CancelFunc
	closeOnce sync.Once
	wg        sync.WaitGroup // keep-alives and the listener

	mu        sync.Mutex
	closed    bool
	leases    map[Handle]*Lease // live leases, one per acquisition
	releasing map[Handle]int    // acquisitions released in the background (releaseInBackground)
	lis       *listener         // started by the first Acquire that waits

	turns turns                   // Acquire calls queued per name (see queue.go)
	rels  combiner[queuedRelease] // releases combined into batches (batch.go)
	fasts combiner[queuedFast]    // fast retakes combined into batches
	ren   *renewer                // started by the first kept-alive lease

	parked atomic.Int64 // Acquire calls blocked waiting (for tests)
	// The acquire calls and the renewals failing now, for the Logger.
	acquireFails, renewFails failrun.Run
	seen                     tokenMemory // the highest token seen per name (regress.go)

	minRenew time.Duration // MinRenewInterval; lower in some tests (export_test.go)
}

// New returns a store over pool, configured by cfg (see [Config] for the
// defaults). It does not touch the database: run [Store.Migrate] or the DDL
// of [SchemaSQL] first. The pool stays the caller's: Close does not close it.
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Store{
		pool:      newModalPool(pool, cfg),
		cfg:       cfg,
		q:         newQueries(cfg),
		mq:        newMultiQueries(cfg),
		leases:    make(map[Handle]*Lease),
		releasing: make(map[Handle]int),
		turns:     turns{q: make(map[string][]*turn)},
		minRenew:  MinRenewInterval,
	}
	s.ctx, s.stop = context.WithCancel(context.Background())
	return s, nil
}

// Config returns the store's configuration, defaults filled in (the zero
// Config for a nil Store).
func (s *Store) Config() Config {
	if s == nil {
		return Config{}
	}
	return s.cfg
}

// Close stops every keep-alive and the listener, wakes every waiting
// [Store.Acquire] (which returns [ErrClosed]) and waits for the store's
// goroutines and for the acquisitions under way: one that takes its row
// after Close began releases it again and returns ErrClosed, so that no row
// is left held by a caller who got an error. Close does not release live
// leases: their rows expire at the end of their TTL, so a lease handed to
// another process (see [Handle]) survives. Release leases first to free
// them at once. The contexts of leases still live are cancelled with cause
// [ErrClosed]. Every later call on the store or its leases returns
// ErrClosed. Close is idempotent; ctx bounds the wait.
func (s *Store) Close(ctx context.Context) error {
	if ctx == nil {
		return errors.New("lease: close: nil context")
	}
	if err := s.usable(); err != nil {
		return fmt.Errorf("lease: close: %w", err)
	}
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		leases := make([]*Lease, 0, len(s.leases))
		for _, l := range s.leases {
			leases = append(leases, l)
		}
		s.mu.Unlock()
		s.stop()
		for _, l := range leases {
			l.abandon(ErrClosed)
		}
	})
	waited := make(chan struct{})
	go func() { s.wg.Wait(); close(waited) }()
	select {
	case <-waited:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("lease: close: %w", context.Cause(ctx))
	}
}

// checkOpen returns nil while the store is open, ErrClosed after Close, and
// an error naming the problem for a nil or zero Store.
func (s *Store) checkOpen() error {
	if err := s.usable(); err != nil {
		return err
	}
	if s.ctx.Err() != nil {
		return ErrClosed
	}
	return nil
}

// enter counts an operation under way that Close must wait for (one that
// may take a row, or start background work); it fails once the store is
// closed. Every successful enter is paired with exit. While an operation
// is counted, it may add background goroutines to s.wg.
func (s *Store) enter() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.wg.Add(1)
	return nil
}

func (s *Store) exit() { s.wg.Done() }

// track registers a live lease so that Close can stop it and Resume find
// it; it fails once the store is closed. If the store already has a live
// Lease of the same acquisition (a racing Resume made it), it returns that
// one and registers nothing.
func (s *Store) track(l *Lease) (*Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	h := l.Handle()
	if live := s.leases[h]; live != nil {
		return live, nil
	}
	s.leases[h] = l
	return nil, nil
}

func (s *Store) untrack(l *Lease) {
	s.mu.Lock()
	if h := l.Handle(); s.leases[h] == l {
		delete(s.leases, h)
	}
	s.mu.Unlock()
}

// liveLease returns the store's live Lease of the acquisition h, or nil.
func (s *Store) liveLease(h Handle) *Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leases[h]
}

// checkName applies [pglocks.ValidateName] and [MaxNameLen].
func checkName(name string) error {
	if err := pglocks.ValidateName(name); err != nil {
		return err
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("%w: name of %d bytes is longer than lease.MaxNameLen (%d)", pglocks.ErrInvalidKey, len(name), MaxNameLen)
	}
	return nil
}

// short returns name for an error message: at most 64 bytes of it (cut at
// a rune boundary) and an ellipsis.
func short(name string) string {
	if len(name) <= 64 {
		return name
	}
	i := 64
	for i > 0 && !utf8.RuneStart(name[i]) {
		i--
	}
	return name[:i] + "…"
}

func checkCtx(ctx context.Context) error {
	if ctx == nil {
		return errors.New("lease: nil context")
	}
	return nil
}

func (s *Store) checkTTL(ttl time.Duration, keepAlive bool) error {
	margin := s.cfg.margin(ttl)
	switch {
	case ttl <= 0:
		return fmt.Errorf("%w: %v is not positive", ErrInvalidTTL, ttl)
	case ttl < MinTTL:
		return fmt.Errorf("%w: %v is below the minimum of %v", ErrInvalidTTL, ttl, MinTTL)
	case ttl > s.cfg.MaxTTL:
		return fmt.Errorf("%w: %v is above Config.MaxTTL (%v)", ErrInvalidTTL, ttl, s.cfg.MaxTTL)
	case ttl <= margin:
		return fmt.Errorf("%w: %v is not longer than Config.SafetyMargin (%v)", ErrInvalidTTL, ttl, s.cfg.SafetyMargin)
	case keepAlive:
		return s.checkKeepAlive(ttl)
	}
	return nil
}

// checkKeepAlive checks that a kept-alive lease of this TTL is renewed
// before its trust deadline: TTL − SafetyMargin > TTL × RenewFraction, and
// not back to back: TTL × RenewFraction ≥ MinRenewInterval.
func (s *Store) checkKeepAlive(ttl time.Duration) error {
	if every := s.cfg.renewInterval(ttl); every < s.minRenew {
		return fmt.Errorf("%w: %v with keep-alive: the renewal interval TTL × Config.RenewFraction (%v) is below the minimum of %v",
			ErrInvalidTTL, ttl, every, s.minRenew)
	}
	if window, every := ttl-s.cfg.margin(ttl), s.cfg.renewInterval(ttl); window <= every {
		return fmt.Errorf("%w: %v with keep-alive: the trust window TTL − Config.SafetyMargin (%v) is not longer than the renewal interval TTL × Config.RenewFraction (%v), so the lease would be lost before its first renewal",
			ErrInvalidTTL, ttl, window, every)
	}
	return nil
}

// check validates the arguments common to TryAcquire, Acquire and Do.
func (s *Store) check(ctx context.Context, name string, ttl time.Duration, opts []Option) (options, error) {
	o := applyOptions(opts)
	if err := checkCtx(ctx); err != nil {
		return o, err
	}
	if err := s.checkOpen(); err != nil {
		return o, err
	}
	if err := checkName(name); err != nil {
		return o, err
	}
	if err := s.checkTTL(ttl, o.keepAlive); err != nil {
		return o, err
	}
	if err := o.checkMaxHold(); err != nil {
		return o, err
	}
	if o.metadata != nil {
		if err := checkJSON(o.metadata); err != nil {
			return o, outcome.MarkFatal(fmt.Errorf("lease: WithMetadata: %w (PostgreSQL's jsonb refuses it)", err))
		}
	}
	if o.hasOwner && o.owner == uuid.Nil {
		return o, errors.New("lease: WithOwner: the zero UUID is not an owner (it marks a released lease in Info)")
	}
	if !o.hasOwner {
		id, err := uuid.NewRandom() // version 4, from crypto/rand
		if err != nil {
			return o, fmt.Errorf("lease: new owner id: %w", err)
		}
		o.owner = id
	}
	return o, nil
}

// TryAcquire acquires the lease name for ttl if it is free, released or
// expired by the server clock, in one statement and one round trip (two when
// this store released the name last and it was taken since: see the package
// doc, Model). The token of the new lease is the name's previous token + 1
// (1 the first time). If another owner holds it, the error is a [*HeldError]
// (errors.Is ErrHeld) with the holder's owner, token and time left; such a
// failed try takes no row lock and writes nothing. A serialization failure
// (under a serializable default isolation) is retried at once. If the
// outcome is unknown (the reply was lost, ctx ended while the statement
// ran), the error says so and the attempt is cleaned up in the background by
// its own id, which no other acquisition shares. ctx bounds the call.
func (s *Store) TryAcquire(ctx context.Context, name string, ttl time.Duration, opts ...Option) (*Lease, error) {
	o, err := s.check(ctx, name, ttl, opts)
	if err != nil {
		return nil, fmt.Errorf("try acquire lease %q: %w", short(name), err)
	}
	start := s.cfg.Now()
	l, err := s.try(ctx, name, ttl, o)
	if err != nil {
		return s.observeAcquire(name, false, start, nil, fmt.Errorf("try acquire lease %q: %w", short(name), err))
	}
	return s.observeAcquire(name, false, start, l, nil)
}
