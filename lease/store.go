package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
)

// Store acquires and inspects leases in one lease table through a pool. It
// is safe for concurrent use. Make it with [New]; Close it when done.
type Store struct {
	pool *pgxpool.Pool
	cfg  Config
	q    queries

	ctx       context.Context // cancelled by Close
	stop      context.CancelFunc
	closeOnce sync.Once
	wg        sync.WaitGroup // keep-alives and the listener

	mu     sync.Mutex
	closed bool
	leases map[*Lease]struct{} // live leases with a keep-alive or trust timer
	lis    *listener           // started by the first Acquire that waits

	parked atomic.Int64 // Acquire calls blocked waiting (for tests)
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
		pool:   pool,
		cfg:    cfg,
		q:      newQueries(cfg),
		leases: make(map[*Lease]struct{}),
	}
	s.ctx, s.stop = context.WithCancel(context.Background())
	return s, nil
}

// Config returns the store's configuration, defaults filled in.
func (s *Store) Config() Config { return s.cfg }

// Close stops every keep-alive and the release listener, wakes every
// waiting [Store.Acquire] (which returns [ErrClosed]) and waits for the
// store's goroutines to end. It does not release leases: their rows expire
// at the end of their TTL, so a lease handed to another process (see
// [Handle]) survives. Release leases first to free them at once. The
// contexts of leases still live are cancelled with cause [ErrClosed]. Every
// later call on the store or its leases returns ErrClosed. Close is
// idempotent; ctx bounds the wait for the goroutines.
func (s *Store) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		leases := make([]*Lease, 0, len(s.leases))
		for l := range s.leases {
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

func (s *Store) checkOpen() error {
	if s.ctx.Err() != nil {
		return ErrClosed
	}
	return nil
}

// track registers a live lease so that Close can stop it; it fails once
// the store is closed.
func (s *Store) track(l *Lease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.leases[l] = struct{}{}
	return nil
}

func (s *Store) untrack(l *Lease) {
	s.mu.Lock()
	delete(s.leases, l)
	s.mu.Unlock()
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

func (s *Store) checkTTL(ttl time.Duration) error {
	switch {
	case ttl <= 0:
		return fmt.Errorf("%w: %v is not positive", ErrInvalidTTL, ttl)
	case ttl < MinTTL:
		return fmt.Errorf("%w: %v is below the minimum of %v", ErrInvalidTTL, ttl, MinTTL)
	case ttl > s.cfg.MaxTTL:
		return fmt.Errorf("%w: %v is above Config.MaxTTL (%v)", ErrInvalidTTL, ttl, s.cfg.MaxTTL)
	case ttl <= s.cfg.margin(ttl):
		return fmt.Errorf("%w: %v is not longer than Config.SafetyMargin (%v)", ErrInvalidTTL, ttl, s.cfg.SafetyMargin)
	}
	return nil
}

// check validates the arguments common to TryAcquire, Acquire and Do.
func (s *Store) check(name string, ttl time.Duration, opts []Option) (options, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if err := s.checkOpen(); err != nil {
		return o, err
	}
	if err := checkName(name); err != nil {
		return o, err
	}
	if err := s.checkTTL(ttl); err != nil {
		return o, err
	}
	if o.metadata != nil && !jsonValid(o.metadata) {
		return o, errors.New("lease: WithMetadata: not valid JSON")
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
// expired by the server clock, in one statement and one round trip. The
// token of the new lease is the name's previous token + 1 (1 the first
// time). If another owner holds it, the error is a [*HeldError] (errors.Is
// ErrHeld) with the holder's owner, token and time left; such a failed try
// takes no row lock and writes nothing. ctx bounds the round trip.
func (s *Store) TryAcquire(ctx context.Context, name string, ttl time.Duration, opts ...Option) (*Lease, error) {
	o, err := s.check(name, ttl, opts)
	if err != nil {
		return nil, fmt.Errorf("try acquire lease %q: %w", name, err)
	}
	l, err := s.try(ctx, name, ttl, o)
	if err != nil {
		return nil, fmt.Errorf("try acquire lease %q: %w", name, err)
	}
	return l, nil
}

// try runs the acquire statement. In a narrow race — the row changed
// between the statement's snapshot and its update, so that it neither
// acquired nor saw a holder — it runs it again with a fresh snapshot.
func (s *Store) try(ctx context.Context, name string, ttl time.Duration, o options) (*Lease, error) {
	for range 100 {
		sent := s.cfg.Now()
		r, err := s.q.acquire(ctx, s.pool, name, o, ttl, s.cfg)
		if err != nil {
			if ambiguous(err) {
				// A fresh owner matches only this attempt's row, so its
				// cleanup may run late. A caller's owner may acquire again
				// right after this error: clean up before returning.
				s.cleanup(name, o.owner, ttl, o.hasOwner)
			}
			return nil, err
		}
		switch {
		case r.acquired:
			return s.newLease(name, o.owner, r.token, ttl, r.expiresAt, sent, o.keepAlive)
		case r.held:
			return nil, &HeldError{Name: name, Owner: r.owner, Token: r.token, ExpiresIn: r.expiresIn}
		}
	}
	return nil, errors.New("lease: the row kept changing during 100 tries")
}
