package lease

import (
	"context"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pglocks/pglocks/internal/outcome"
)

// fastManySQL is fastSQL for many names in one statement and one commit:
// the batch of a store's fast retakes that overlap in time (see
// fastBatch). Each row of the arrays is one attempt: name, owner, TTL in
// microseconds, hostname, pid, metadata, attempt id; RETURNING names the
// attempts that took their row, so two attempts of one name in a batch
// cannot both win. Rows locked by others are skipped, not waited for: such
// an attempt, like one whose row is not released, gets no row and goes on
// with retakeSQL alone. Like releaseManySQL, the arrays are read through
// scalar subqueries, so that the server keeps one generic plan.
const fastManySQL = `with lk as (
	select l.name, k.owner, k.ttl_us, k.host, k.pid, k.meta, k.attempt from {T} l,
		unnest((select $1::text[]), (select $2::uuid[]), (select $3::bigint[]), (select $4::text[]),
			(select $5::int[]), (select $6::jsonb[]), (select $7::uuid[])) as k(name, owner, ttl_us, host, pid, meta, attempt)
	where l.name = k.name and l.owner is null
	for no key update of l skip locked
)
update {T} l set owner = lk.owner, attempt = lk.attempt, token = l.token + 1, ttl = lk.ttl_us * interval '1 microsecond',
	acquired_at = clock_timestamp(), renewed_at = clock_timestamp(),
	expires_at = clock_timestamp() + lk.ttl_us * interval '1 microsecond',
	hostname = lk.host, pid = lk.pid, metadata = lk.meta
from lk where l.name = lk.name and l.owner is null
returning l.attempt, l.token, l.expires_at, {LAG}, {SYNC}`

// shot is the outcome of one acquire statement for one attempt, with what
// try needs to trust it or to settle it.
type shot struct {
	r   acquireResult
	err error
	// b is the backend that ran the statement, and when it was sent; its
	// pid is 0 when nothing can still be running there (see cleanup).
	b backend
	// settled: an unknown outcome whose cleanup the batch goroutine runs
	// once the batch's outcome is known (the caller gave up while it ran).
	settled bool
	// alone: the batch did not answer for the attempt (it failed without
	// running); the caller runs its statement alone.
	alone bool
}

// queuedFast is a fast retake waiting for a batch (see combiner).
type queuedFast struct {
	name    string
	attempt uuid.UUID
	o       options
	ttl     time.Duration
	ticket[shot]
}

// shoot runs the acquire statement of kind for one attempt: a fast retake
// alone or in a batch, any other kind alone. An error says nothing was
// sent.
func (s *Store) shoot(ctx context.Context, name string, attempt uuid.UUID, o options, ttl time.Duration, kind acquireKind) (shot, error) {
	if kind != acquireFast {
		return s.shootAlone(ctx, name, attempt, o, ttl, kind)
	}
	q := &queuedFast{name: name, attempt: attempt, o: o, ttl: ttl, ticket: newTicket[shot]()}
	if admit(s, &s.fasts, q, s.fastBatch) {
		defer s.fasts.alone()
		return s.shootAlone(ctx, name, attempt, o, ttl, kind)
	}
	sh, abandoned, err := await(ctx, &s.fasts, q, &q.ticket)
	switch {
	case err != nil:
		return shot{}, err
	case abandoned:
		return shot{err: givenUp(ctx), settled: true}, nil
	case sh.alone:
		return s.shootAlone(ctx, name, attempt, o, ttl, kind)
	}
	return sh, nil
}

// shootAlone runs the acquire statement of kind on a connection of its own.
func (s *Store) shootAlone(ctx context.Context, name string, attempt uuid.UUID, o options, ttl time.Duration, kind acquireKind) (shot, error) {
	var r acquireResult
	b, err := s.onConn(ctx, func(db querier) (err error) {
		r, err = s.q.acquire(ctx, db, name, attempt, o, ttl, s.cfg, kind)
		return err
	})
	if b.sent.IsZero() {
		return shot{}, err
	}
	return shot{r: r, err: err, b: b}, nil
}

// fastBatch runs fastManySQL for batch and hands each attempt its shot.
// An attempt whose caller gave up while the batch ran is settled here,
// after the batch's outcome is known: what it took is cleaned up by its
// attempt id, and after an unknown outcome the batch's backend is ended
// first (see cleanup), so no late commit can outlive the cleanup. If the
// batch failed without running (a connection refused, one attempt's input
// refused by the server, a serialization failure), every attempt runs
// alone.
func (s *Store) fastBatch(batch []*queuedFast) {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	var res map[uuid.UUID]acquireResult
	b, err := s.onConn(ctx, func(db querier) (err error) {
		// Attempts given up before this point (while the batch waited for
		// its connection, say) are left out: nothing is sent for them.
		send := slices.DeleteFunc(slices.Clone(batch), func(q *queuedFast) bool { return q.abandoned() })
		if len(send) == 0 {
			return nil
		}
		res, err = s.q.fastMany(ctx, db, send, s.cfg)
		return err
	})
	if err == nil {
		err = ackedLate(ctx)
	}
	unknown := outcome.Of(err) == outcome.Unknown
	for _, q := range batch {
		sh := shot{r: res[q.attempt], b: b, alone: err != nil && !unknown}
		if unknown {
			sh.err = err
		}
		if !q.answer(sh) && (unknown || sh.r.acquired) {
			s.cleanup([]string{q.name}, q.attempt, q.ttl, b)
		}
	}
}

// fastMany runs fastManySQL for batch and returns the acquisitions by
// attempt id.
func (q queries) fastMany(ctx context.Context, db querier, batch []*queuedFast, cfg Config) (map[uuid.UUID]acquireResult, error) {
	n := len(batch)
	var (
		names  = make([]string, n)
		owners = make([]pgtype.UUID, n)
		ttls   = make([]int64, n)
		hosts  = make([]*string, n)
		pids   = make([]int32, n)
		metas  = make([]*string, n)
		atts   = make([]pgtype.UUID, n)
	)
	for i, b := range batch {
		names[i], owners[i], ttls[i], pids[i], atts[i] = b.name, pgUUID(b.o.owner), b.ttl.Microseconds(), int32(cfg.PID), pgUUID(b.attempt)
		if cfg.Hostname != "" {
			hosts[i] = &cfg.Hostname
		}
		if b.o.metadata != nil {
			m := string(b.o.metadata)
			metas[i] = &m
		}
	}
	rows, err := db.Query(ctx, q.fastManySQL, names, owners, ttls, hosts, pids, metas, atts)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	res := make(map[uuid.UUID]acquireResult, n)
	for rows.Next() {
		var (
			attempt pgtype.UUID
			token   int64
			exp     time.Time
			us      int64
		)
		if err := rows.Scan(&attempt, &token, &exp, &us, nil); err != nil {
			return nil, err
		}
		res[attempt.Bytes] = acquireResult{acquired: true, token: token, expiresAt: exp, lag: time.Duration(us) * time.Microsecond}
	}
	return res, rows.Err()
}
