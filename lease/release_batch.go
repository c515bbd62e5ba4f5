package lease

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pglocks/pglocks/internal/outcome"
)

// releaseManySQL is the release of many leases, each scoped to (name,
// owner, token), in one statement and one commit: the batch of a store's
// releases that overlap in time (see releaseBatch). Rows locked by others
// (a Guard's FOR SHARE) are skipped, not waited for: one guarded
// transaction holds back no other release. A lease the batch does not
// return is released alone by releaseSQL, which waits for the row and
// says whether it was held. Each released row's interest key is tried as
// releaseSQL tries it (see listener): a transaction-level advisory lock
// held until the commit, one per row, which maxBatch bounds. The arrays
// are read through scalar subqueries, so that the plan does not depend on
// their length: the server keeps one generic plan for the prepared
// statement instead of planning it again for every batch.
const releaseManySQL = `with lk as (
	select l.name, k.owner, k.token, k.key from {T} l,
		unnest((select $1::text[]), (select $2::uuid[]), (select $3::bigint[]), (select $4::bigint[])) as k(name, owner, token, key)
	where l.name = k.name and l.owner = k.owner and l.token = k.token and l.expires_at > clock_timestamp()
	for no key update of l skip locked
)
update {T} l set owner = null, expires_at = clock_timestamp()
from lk where l.name = lk.name and l.owner = lk.owner and l.token = lk.token and l.expires_at > clock_timestamp()
returning l.name, lk.owner, l.token, {GIVEUP},
	case when pg_catalog.pg_try_advisory_xact_lock(lk.key) then null else pg_notify($5, 'r' || l.name) end`

// queuedRelease is a release waiting for a batch (see combiner).
type queuedRelease struct {
	name  string
	owner uuid.UUID
	token int64
	ticket[batchResult]
}

// batchResult is a batch's outcome for one release: released, or the
// batch's Unknown error, or neither (the release runs alone).
type batchResult struct {
	released bool
	err      error
}

// releaseOnce releases (name, owner, token), alone or in a batch, and
// reports whether the release changed the row. A caller whose ctx ends
// while its batch runs gets an unknown outcome: the release may have run,
// and the caller settles it with releaseLater, which, scoped to the same
// acquisition, frees the row whichever commits first. The caller must be
// inside enter/exit.
func (s *Store) releaseOnce(ctx context.Context, name string, owner uuid.UUID, token int64) (bool, error) {
	q := &queuedRelease{name: name, owner: owner, token: token, ticket: newTicket[batchResult]()}
	if admit(s, &s.rels, q, s.releaseBatch) {
		defer s.rels.alone()
		return s.releaseAlone(ctx, name, owner, token)
	}
	res, abandoned, err := await(ctx, &s.rels, q, &q.ticket)
	switch {
	case err != nil:
		return false, err
	case abandoned:
		return false, givenUp(ctx)
	case res.released || res.err != nil:
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
// result. If the batch failed without running, every release runs alone.
func (s *Store) releaseBatch(batch []*queuedRelease) {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	var released map[releasedRow]bool
	_, err := s.onConn(ctx, func(db querier) (err error) {
		released, err = s.q.releaseMany(ctx, db, batch)
		return err
	})
	unknown := outcome.Of(err) == outcome.Unknown
	for _, q := range batch {
		var res batchResult
		switch k := (releasedRow{q.name, q.owner, q.token}); {
		case unknown:
			res.err = fmt.Errorf("release batch: %w", err)
		case err == nil && released[k]:
			res.released = true
			delete(released, k) // a second release of the lease runs alone, and finds it released
		}
		q.answer(res)
	}
}

// releasedRow is an acquisition a release batch released.
type releasedRow struct {
	name  string
	owner uuid.UUID
	token int64
}

// releaseMany runs releaseManySQL for batch and returns the rows it
// released.
func (q queries) releaseMany(ctx context.Context, db querier, batch []*queuedRelease) (map[releasedRow]bool, error) {
	names := make([]string, len(batch))
	owners := make([]pgtype.UUID, len(batch))
	tokens := make([]int64, len(batch))
	keys := make([]int64, len(batch))
	for i, r := range batch {
		names[i], owners[i], tokens[i] = r.name, pgUUID(r.owner), r.token
		keys[i] = interestKey(q.channel, r.name)
	}
	rows, err := db.Query(ctx, q.releaseManySQL, names, owners, tokens, keys, q.channel)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	released := make(map[releasedRow]bool, len(batch))
	for rows.Next() {
		var (
			k     releasedRow
			owner pgtype.UUID
		)
		if err := rows.Scan(&k.name, &owner, &k.token, nil, nil); err != nil {
			return nil, err // a reply not understood: Unknown
		}
		k.owner = owner.Bytes
		released[k] = true
	}
	return released, rows.Err()
}
