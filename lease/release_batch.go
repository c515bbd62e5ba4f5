package lease

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pglocks/pglocks/internal/outcome"
)

// queuedRelease is a release waiting for a batch (see combiner).
type queuedRelease struct {
	name  string
	owner uuid.UUID
	token int64
	done  chan batchResult // buffered: a batch never waits for its caller
}

// batchResult is a batch's outcome for one release: released, or the
// batch's Unknown error, or neither (the release must run alone).
type batchResult struct {
	released bool
	err      error
}

// releaseOnce releases (name, owner, token), alone or in a batch, and
// reports whether the release changed the row. A caller whose ctx ends
// while the batch runs gets an Unknown error: the release may have run,
// and the caller settles it with releaseLater, which, scoped to the same
// acquisition, frees the row whichever commits first. The caller must be
// inside enter/exit.
func (s *Store) releaseOnce(ctx context.Context, name string, owner uuid.UUID, token int64) (bool, error) {
	q := &queuedRelease{name: name, owner: owner, token: token, done: make(chan batchResult, 1)}
	direct, start := s.rels.join(q)
	if direct {
		defer s.rels.alone()
		return s.releaseAlone(ctx, name, owner, token)
	}
	if start {
		s.wg.Add(1) // inside enter/exit: Close waits for the batches
		go runBatches(s, &s.rels, s.releaseBatch)
	}
	var res batchResult
	select {
	case res = <-q.done:
	case <-ctx.Done():
		if s.rels.dequeue(q) {
			return false, outcome.MarkNotSent(fmt.Errorf("release waited for a batch: %w", context.Cause(ctx)))
		}
		select {
		case res = <-q.done:
		default:
			return false, fmt.Errorf("release sent in a batch: %w", context.Cause(ctx))
		}
	}
	if res.released || res.err != nil {
		return res.released, res.err
	}
	return s.releaseAlone(ctx, name, owner, token)
}

// releaseAlone runs releaseSQL for (name, owner, token) and reports whether
// it changed the row.
func (s *Store) releaseAlone(ctx context.Context, name string, owner uuid.UUID, token int64) (bool, error) {
	var n int64
	err := retrySerialization(ctx, func() error {
		tag, err := s.pool.Exec(ctx, s.q.releaseSQL, name, pgUUID(owner), token, s.q.channel, interestKey(s.q.channel, name))
		n = tag.RowsAffected()
		return err
	})
	return n > 0, err
}

// releaseBatch runs releaseManySQL for batch and hands each release its
// result.
func (s *Store) releaseBatch(batch []*queuedRelease) {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	names := make([]string, len(batch))
	owners := make([]pgtype.UUID, len(batch))
	tokens := make([]int64, len(batch))
	keys := make([]int64, len(batch))
	for i, q := range batch {
		names[i], owners[i], tokens[i] = q.name, pgUUID(q.owner), q.token
		keys[i] = interestKey(s.q.channel, q.name)
	}
	type row struct {
		name  string
		token int64
	}
	released := make(map[row]bool, len(batch))
	rows, err := s.pool.Query(ctx, s.q.releaseManySQL, names, owners, tokens, keys, s.q.channel)
	if err == nil {
		for err == nil && rows.Next() {
			var k row
			err = rows.Scan(&k.name, &k.token, nil, nil) // a reply not understood: Unknown
			released[k] = true
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	unknown := err != nil && outcome.Of(err) == outcome.Unknown
	for _, q := range batch {
		var res batchResult
		switch k := (row{q.name, q.token}); {
		case unknown:
			res.err = fmt.Errorf("release batch: %w", err)
		case err == nil && released[k]:
			res.released = true
			delete(released, k) // a second release of the lease runs alone, and finds it released
		}
		q.done <- res
	}
}
