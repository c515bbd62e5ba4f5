package lease

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pglocks/pglocks/internal/outcome"
)

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
}

// queuedFast is a fast retake waiting for a batch (see combiner).
type queuedFast struct {
	name    string
	attempt uuid.UUID
	o       options
	ttl     time.Duration
	state   atomic.Int32 // queuedWaiting, then queuedAnswered or queuedAbandoned
	done    chan shot    // buffered: a batch never waits for its caller
}

const (
	queuedWaiting int32 = iota
	queuedAnswered
	queuedAbandoned
)

// shoot runs the acquire statement of kind for one attempt: a fast retake
// alone or in a batch, any other kind alone. An error says nothing was
// sent.
func (s *Store) shoot(ctx context.Context, name string, attempt uuid.UUID, o options, ttl time.Duration, kind acquireKind) (shot, error) {
	if kind != acquireFast {
		return s.shootAlone(ctx, name, attempt, o, ttl, kind)
	}
	q := &queuedFast{name: name, attempt: attempt, o: o, ttl: ttl, done: make(chan shot, 1)}
	direct, start := s.fasts.join(q)
	if direct {
		defer s.fasts.alone()
		return s.shootAlone(ctx, name, attempt, o, ttl, kind)
	}
	if start {
		s.wg.Add(1) // inside enter/exit: Close waits for the batches
		go runBatches(s, &s.fasts, s.fastBatch)
	}
	var sh shot
	select {
	case sh = <-q.done:
	case <-ctx.Done():
		if s.fasts.dequeue(q) {
			return shot{}, outcome.MarkNotSent(fmt.Errorf("acquire waited for a batch: %w", context.Cause(ctx)))
		}
		if q.state.CompareAndSwap(queuedWaiting, queuedAbandoned) {
			return shot{err: fmt.Errorf("acquire sent in a batch: %w", context.Cause(ctx)), settled: true}, nil
		}
		sh = <-q.done // answered meanwhile
	}
	return sh, nil
}

// shootAlone runs the acquire statement of kind on a connection of its own.
func (s *Store) shootAlone(ctx context.Context, name string, attempt uuid.UUID, o options, ttl time.Duration, kind acquireKind) (shot, error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return shot{}, err
	}
	b := backend{pid: c.Conn().PgConn().PID(), sent: s.cfg.Now()}
	r, err := s.q.acquire(ctx, s.pool.on(c), name, attempt, o, ttl, s.cfg, kind)
	inFlight := c.Conn().IsClosed() // the server may still be running it
	c.Release()
	if !inFlight || s.pool.pooled() {
		// Nothing in flight, or a pid that names no server backend (behind
		// a pooler): nothing to end or wait for.
		b.pid = 0
	}
	return shot{r: r, err: err, b: b}, nil
}

// fastBatch runs fastManySQL for batch and hands each attempt its shot.
// An attempt whose caller gave up while the batch ran is settled here,
// after the batch's outcome is known: what it took is cleaned up by its
// attempt id, and after an unknown outcome the batch's backend is ended
// first (see cleanup), so no late commit can outlive the cleanup.
func (s *Store) fastBatch(batch []*queuedFast) {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	var (
		res map[uuid.UUID]acquireResult
		sh  shot
	)
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		sh.err = outcome.MarkNotSent(err)
	} else {
		sh.b = backend{pid: c.Conn().PgConn().PID(), sent: s.cfg.Now()}
		res, sh.err = s.q.fastMany(ctx, s.pool.on(c), batch, s.cfg)
		if !c.Conn().IsClosed() || s.pool.pooled() {
			sh.b.pid = 0
		}
		c.Release()
		if sh.err == nil {
			sh.err = ackedLate(ctx)
		}
	}
	unknown := outcome.Of(sh.err) == outcome.Unknown
	for _, q := range batch {
		one := sh
		one.r = res[q.attempt]
		if q.state.CompareAndSwap(queuedWaiting, queuedAnswered) {
			q.done <- one
		} else if unknown || one.r.acquired {
			s.cleanup(q.name, q.attempt, q.ttl, one.b)
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
