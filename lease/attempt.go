package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/pglocks/pglocks/internal/backoff"
	"github.com/pglocks/pglocks/internal/outcome"
)

// settleMax bounds the background work that settles an unknown outcome: a
// row it could not free by then expires at the end of its TTL anyway.
const settleMax = 30 * time.Second

// errUnknown marks an error after which the operation may or may not have
// run on the server.
var errUnknown = errors.New("outcome unknown")

// ackedLate makes a success that arrived after ctx ended an unknown
// outcome, for statements that grant or extend trust (acquire, renew,
// resume). With pgx's CancelRequestContextWatcherHandler an ended ctx sends
// the server a cancel; a cancel that finds the commit waiting for a
// synchronous standby ends the wait with a WARNING and reports success,
// although the standby may not have the commit, and a failover then loses
// it (TestSyncCancelledCommit). pgx's default handler closes the socket
// instead, which ends in an error. A statement cancelled any other way
// (statement_timeout, pg_cancel_backend) cannot be told apart: see the
// package doc, Failover.
func ackedLate(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	return fmt.Errorf("%w: the reply came after the context ended (%w): the commit may have been cut short before a synchronous standby had it", errUnknown, ctx.Err())
}

// try runs the acquire statement once per attempt, each with a fresh
// attempt id recorded in the row: fastSQL for a name the store released
// last, retakeSQL for another name of which the store has seen a token
// (its row exists), else acquireSQL, which inserts a missing row. A
// fastSQL that finds the row not released is followed by retakeSQL. In a
// narrow race — the row changed between the statement's
// snapshot and its update, so that it neither acquired nor saw a holder —
// or after a serialization failure, it runs it again (acquireSQL after a
// retake that found no row). If an attempt's outcome is unknown, the
// attempt is cleaned up in the background by its id (see cleanup), which
// cannot free any other acquisition, and try returns at once: ctx is
// honoured.
func (s *Store) try(ctx context.Context, name string, ttl time.Duration, o options) (*Lease, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.exit()
	bo := backoff.Backoff{Min: time.Millisecond, Max: 50 * time.Millisecond}
	full := false // a retake found no row: insert it
	for range 100 {
		attempt, err := uuid.NewRandom()
		if err != nil {
			return nil, fmt.Errorf("lease: new attempt id: %w", err)
		}
		seen, kind := s.acquireKind(name, full)
		sh, err := s.shoot(ctx, name, attempt, o, ttl, kind)
		if err != nil {
			return nil, err // nothing was sent
		}
		r, err := sh.r, sh.err
		if err == nil && r.acquired {
			err = ackedLate(ctx)
		}
		switch {
		case err != nil && serialization(err):
			if werr := bo.Wait(ctx); werr != nil {
				return nil, fmt.Errorf("%w (last error: %w)", werr, err)
			}
		case err != nil:
			if outcome.Of(err) == outcome.Unknown {
				if !sh.settled {
					s.cleanup([]string{name}, attempt, ttl, sh.b)
				}
				return nil, fmt.Errorf("%w (%w: the attempt is being cleaned up in the background)", err, errUnknown)
			}
			return nil, err
		case r.acquired:
			if err := s.checkGranted(ctx, name, o.owner, r.token, seen, ttl); err != nil {
				return nil, err
			}
			start := trustStart(sh.b.sent, r.lag, s.cfg.Now())
			return s.newLease(ctx, name, o.owner, r.token, ttl, r.expiresAt, start, o, true)
		case r.held:
			s.seen.observe(name, r.token)
			return nil, &HeldError{Name: name, Owner: r.owner, Token: r.token, ExpiresIn: r.expiresIn}
		case kind == acquireFast:
			// Not released: retakeSQL takes an expired row or reports the
			// holder; the store's later tries, of any call, skip fastSQL.
			s.seen.stale(name, seen)
		case kind == acquireRetake:
			full = true // no row (deleted?), or the narrow race: the full statement settles both
		}
	}
	return nil, errors.New("lease: the row kept changing during 100 tries")
}

// acquireKind returns the highest token seen for name and the statement
// for the next try of it: acquireSQL when no token was seen (there may be
// no row) or a retake found no row (full), fastSQL when the store released
// the row last and no fastSQL has found it not released since (see
// tokenMemory.stale), else retakeSQL.
func (s *Store) acquireKind(name string, full bool) (int64, acquireKind) {
	seen, free := s.seen.get(name)
	switch {
	case seen == 0 || full:
		return seen, acquireFull
	case free:
		return seen, acquireFast
	}
	return seen, acquireRetake
}

// cleanup frees, in the background, the acquisitions that the attempt of
// that id may have made of any of names (one name for Store.TryAcquire,
// the set for TryAcquireAll, every slot a semaphore may have for it), in
// one statement scoped to the attempt id. If the attempt's connection was
// closed with its statement possibly still running on backend b, that
// backend is ended first, once (see endBackend): a cleanup that ran
// before the statement's late commit would find nothing and leave the
// names held for the whole TTL by an owner no caller received. The
// caller must be inside enter/exit.
func (s *Store) cleanup(names []string, attempt uuid.UUID, ttl time.Duration, b backend) {
	ended := b.pid == 0
	keys := make([]int64, len(names))
	for i, name := range names {
		keys[i] = interestKey(s.q.channel, name)
	}
	s.settle(ttl, func(ctx context.Context) error {
		if !ended {
			// A fatal error (no pg_stat_activity, say) cannot pass later:
			// clean up at once, as well as can be.
			if err := s.endBackend(ctx, b); err != nil && outcome.Of(err) != outcome.Fatal {
				return err
			}
			ended = true
		}
		_, err := s.pool.Exec(ctx, s.q.cleanupSQL, names, pgUUID(attempt), s.q.channel, keys)
		return err
	})
}

// releaseLater releases (name, owner, token) in the background, after a
// release whose outcome was unknown or that was not sent. The caller must
// be inside enter/exit.
func (s *Store) releaseLater(name string, owner uuid.UUID, token int64, ttl time.Duration) {
	s.releaseInBackground(Handle{Name: name, Owner: owner, Token: token}, ttl, func(ctx context.Context) error {
		return s.releaseRow(ctx, name, owner, token)
	})
}

// releaseInBackground settles stmt, the release of the acquisition h, and
// meanwhile makes Resume refuse h: a Lease resumed now would be freed
// under its holder. The caller must be inside enter/exit.
func (s *Store) releaseInBackground(h Handle, ttl time.Duration, stmt func(ctx context.Context) error) {
	s.mu.Lock()
	s.releasing[h]++
	s.mu.Unlock()
	s.settleThen(ttl, stmt, func() {
		s.mu.Lock()
		if s.releasing[h]--; s.releasing[h] <= 0 {
			delete(s.releasing, h)
		}
		s.mu.Unlock()
	})
}

// isReleasing reports whether the store releases h in the background.
func (s *Store) isReleasing(h Handle) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.releasing[h] > 0
}

// releaseTaken frees the row of an acquisition that cannot be handed out
// (the Store closed between the statement and its reply) and returns why
// it was not, err. It tries on ctx first; if ctx ends or the outcome is
// not known, the release goes on in the background, which Close waits
// for, so the caller is not kept past its ctx and the row is not left
// held for its TTL. The caller must be inside enter/exit.
func (s *Store) releaseTaken(ctx context.Context, name string, owner uuid.UUID, token int64, ttl time.Duration, err error) error {
	rerr := s.releaseRow(ctx, name, owner, token)
	switch {
	case rerr == nil:
		return err
	case outcome.Of(rerr) == outcome.Fatal && ctx.Err() == nil:
		return fmt.Errorf("%w; releasing what it took failed, so the row expires at the end of its TTL: %w", err, rerr)
	}
	s.releaseLater(name, owner, token, ttl)
	return fmt.Errorf("%w; what it took is being released in the background (%w)", err, rerr)
}

// releaseRow runs the release statement for (name, owner, token); whether
// it changed a row does not matter to its callers, which settle an outcome.
func (s *Store) releaseRow(ctx context.Context, name string, owner uuid.UUID, token int64) error {
	_, err := s.releaseAlone(ctx, name, owner, token)
	return err
}

// settle runs stmt in a goroutine that Close waits for, again and again
// with backoff until it gets an answer from the server (or a fatal error),
// for at most min(ttl, settleMax): after the TTL the row has expired
// anyway. stmt is idempotent and scoped to one exact acquisition. The
// caller must be inside enter/exit, so that adding to s.wg is allowed.
func (s *Store) settle(ttl time.Duration, stmt func(ctx context.Context) error) {
	s.settleThen(ttl, stmt, func() {})
}

// settleThen is settle, and calls then when it is over.
func (s *Store) settleThen(ttl time.Duration, stmt func(ctx context.Context) error, then func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer then()
		ctx, cancel := context.WithTimeout(context.Background(), min(ttl, settleMax))
		defer cancel()
		var bo backoff.Backoff
		for {
			actx, acancel := context.WithTimeout(ctx, 5*time.Second)
			err := stmt(actx)
			acancel()
			if c := outcome.Of(err); c == outcome.OK || c == outcome.Fatal {
				return
			}
			if bo.Wait(ctx) != nil {
				return
			}
		}
	}()
}
