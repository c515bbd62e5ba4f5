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

// lostRaces is how many races in a row tryMulti loses to rows locked by
// other transactions before it reports them (multiResult.lost): a racing
// acquisition commits within a few of its backoff steps, a Guard's
// transaction may not end for long, and nothing announces its end.
const lostRaces = 5

// allStmt runs one all-or-none acquire statement on db with the attempt
// id attempt.
type allStmt func(ctx context.Context, db querier, attempt uuid.UUID) (multiResult, error)

// tryMulti runs stmt, an all-or-none acquisition of some of the names
// maybe (every name it may take), until it takes its names, finds them
// held or full, or fails; it is try for a set of names. After lostRaces
// races lost to rows that other transactions keep locked it returns the
// result that names them (multiResult.lost or lostFull). Each attempt has
// a fresh attempt id, recorded in every row it takes. A lost race (no
// row came back), a racing first acquisition of one of the names (23505)
// and a serialization failure are tried again after a short backoff. If
// an attempt's outcome is unknown, every name of maybe is cleaned up in
// the background by that attempt id (see cleanup), which frees only what
// the attempt took, and tryMulti returns at once: ctx is honoured.
func (s *Store) tryMulti(ctx context.Context, maybe []string, ttl time.Duration, o options, stmt allStmt) ([]*Lease, multiResult, error) {
	if err := s.enter(); err != nil {
		return nil, multiResult{}, err
	}
	defer s.exit()
	bo := backoff.Backoff{Min: time.Millisecond, Max: 50 * time.Millisecond}
	lost := 0
	for range 100 {
		attempt, err := uuid.NewRandom()
		if err != nil {
			return nil, multiResult{}, fmt.Errorf("lease: new attempt id: %w", err)
		}
		seen := s.seen.known(maybe)
		var res multiResult
		b, err := s.onConn(ctx, func(db querier) (err error) {
			res, err = stmt(ctx, db, attempt)
			return err
		})
		if b.sent.IsZero() {
			return nil, multiResult{}, err // nothing was sent
		}
		if err == nil && len(res.taken) > 0 {
			err = ackedLate(ctx)
		}
		switch {
		case err != nil && (serialization(err) || outcome.SQLState(err) == "23505"):
		case err != nil && outcome.Of(err) == outcome.Unknown:
			s.cleanup(maybe, attempt, ttl, b)
			return nil, multiResult{}, fmt.Errorf("%w (%w: the attempt is being cleaned up in the background)", err, errUnknown)
		case err != nil:
			return nil, multiResult{}, err
		case len(res.taken) > 0:
			ls, err := s.grantAll(ctx, res.taken, seen, o, ttl, b.sent)
			return ls, res, err
		case len(res.held) > 0:
			for _, h := range res.held {
				s.seen.observe(h.Name, h.Token)
			}
			return nil, res, nil
		case res.full != nil:
			return nil, res, nil
		case len(res.lost) > 0 || res.lostFull != nil:
			if lost++; lost >= lostRaces {
				return nil, res, nil // rows that stay locked: reported as busy, not spun on
			}
		}
		// A lost race, a racing insert, a serialization failure: again.
		if werr := bo.Wait(ctx); werr != nil {
			return nil, multiResult{}, fmt.Errorf("%w (last error: %w)", werr, err)
		}
	}
	return nil, multiResult{}, errors.New("lease: the rows kept changing during 100 tries")
}

// grantAll makes the Leases of the names one statement took, sent at
// sent. Each token is checked against the highest token the store had
// seen for its name before the statement was sent (checkGranted); if one
// is refused, or the store closed meanwhile (newLease), the whole set is
// refused: what was taken is released, at once or in the background
// (releaseTaken), so nothing is left held by a caller who got an error.
// The caller must be inside enter/exit.
func (s *Store) grantAll(ctx context.Context, ts []taken, seen map[string]int64, o options, ttl time.Duration, sent time.Time) ([]*Lease, error) {
	var refused error
	ok := make([]bool, len(ts))
	for i, t := range ts {
		if err := s.checkGranted(ctx, t.name, o.owner, t.token, seen[t.name], ttl); err != nil {
			refused = err // checkGranted releases the refused acquisition itself
			continue
		}
		ok[i] = true
	}
	leases := make([]*Lease, 0, len(ts))
	for i, t := range ts {
		if refused != nil {
			break
		}
		start := trustStart(sent, t.lag, s.cfg.Now())
		l, err := s.newLease(ctx, t.name, o.owner, t.token, ttl, t.expiresAt, start, o, true)
		if err != nil {
			refused, ok[i] = err, false // newLease released it
			break
		}
		leases = append(leases, l)
	}
	if refused == nil {
		return leases, nil
	}
	for _, l := range leases {
		l.abandon(refused)
	}
	for i, t := range ts {
		if ok[i] {
			_ = s.releaseTaken(ctx, t.name, o.owner, t.token, ttl, refused)
		}
	}
	return nil, fmt.Errorf("%w; the other names taken with it were released", refused)
}
