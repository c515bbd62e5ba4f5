package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// turnTTL is the TTL of a waiter's turn: short, so that a waiter that
// vanished holds back others for a few seconds only; it is kept alive.
const turnTTL = 5 * time.Second

// Acquire takes n permits for ttl, waiting until that many are free or
// ctx ends. Each try is that of [Semaphore.TryAcquire]. A waiter whose
// try failed takes the semaphore's turn, when nobody else has it: a lease
// "<name>#turn" of a few seconds (within Config.MaxTTL; a Config under
// which no valid turn TTL exists is an error), kept alive while it waits,
// recording n. While one waiter holds the turn, others take permits only
// when enough are free for both them and the turn's n, so the waiter
// holding the turn is not starved by a stream of smaller takers: the
// permits released meanwhile are kept for it. A turn for n = limit keeps
// every TryAcquire out until all permits are released. The turn is
// released when the waiter takes its permits or gives up (never past
// ctx: a release ctx cuts short goes on in the background). That is the
// whole fairness guarantee: waiters without the turn compete for it, and
// for permits, in no particular order, so one of them may wait through
// many turns of others. Between tries it waits as [Store.Acquire] does: a
// release of any permit, of the turn or a change of the limit wakes it
// (LISTEN/NOTIFY), a holder that vanished is noticed at the soonest
// expiry, rows other transactions keep locked are polled with backoff,
// transient errors are retried with backoff. A waiting Acquire registers
// with the store's listener for every slot that may be held (up to the
// highest limit ever set), the turn and the limit row: one shared
// advisory lock each on the listener's session, taken once per name and
// store. A cancelled wait leaves nothing held.
func (m *Semaphore) Acquire(ctx context.Context, n int, ttl time.Duration, opts ...Option) (*Permits, error) {
	o, err := m.check(ctx, n, ttl, opts)
	if err != nil {
		return nil, fmt.Errorf("semaphore %q: acquire: %w", short(m.Name()), err)
	}
	tTTL, tOpts, err := m.turnOptions(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("semaphore %q: acquire: %w", short(m.name), err)
	}
	start := m.s.cfg.Now()
	var (
		p    *Permits
		turn *Lease
	)
	defer func() { m.dropTurn(ctx, turn) }()
	err = m.s.await(ctx, func(ctx context.Context) (busy, error) {
		if turn != nil && turn.Err() != nil {
			m.dropTurn(ctx, turn) // lost: try for it again
			turn = nil
		}
		var full *FullError
		var err error
		p, full, err = m.try(ctx, n, ttl, o, turn.Owner())
		if full == nil || err != full {
			return busy{}, err
		}
		if turn == nil {
			if turn = m.takeTurn(ctx, tTTL, tOpts); turn != nil {
				return busy{watch: []string{}, wait: 0}, err // try at once, as the turn's holder
			}
		}
		return busy{watch: m.watched(full), wait: full.ExpiresIn, locked: full.Locked > 0}, err
	})
	return m.observe(true, start, p, err)
}

// turnOptions returns the TTL and options of the turn of a waiter for n
// permits: turnTTL, at least three safety margins, at most Config.MaxTTL,
// kept alive. A Config under which no such TTL is valid is an error (the
// waiter could never take the turn, so it would wait without fairness).
func (m *Semaphore) turnOptions(ctx context.Context, n int) (time.Duration, options, error) {
	s := m.s
	ttl := min(max(turnTTL, 3*s.cfg.SafetyMargin), s.cfg.MaxTTL)
	o, err := s.check(ctx, m.name+"#turn", ttl, []Option{WithKeepAlive(), WithMetadata(turnMeta(n))})
	if err != nil {
		return 0, options{}, fmt.Errorf("the turn's TTL %v (kept alive) is not valid under this Config: %w", ttl, err)
	}
	return ttl, o, nil
}

// takeTurn takes the semaphore's turn, or returns nil: another waiter has
// it, or the try failed (the waiter then waits without it, and tries for
// the turn again after its next failed try).
func (m *Semaphore) takeTurn(ctx context.Context, ttl time.Duration, o options) *Lease {
	l, err := m.s.try(ctx, m.name+"#turn", ttl, o)
	if err != nil {
		return nil
	}
	return l
}

// dropTurn releases the turn, if any, never past ctx: with ctx while it
// lasts (Release settles an outcome ctx's end leaves unknown in the
// background), else in the background at once. Whatever happens, the
// turn expires within its TTL.
func (m *Semaphore) dropTurn(ctx context.Context, turn *Lease) {
	switch {
	case turn == nil:
	case ctx.Err() == nil:
		_ = turn.Release(ctx)
	default:
		turn.releaseDetached()
	}
}

// watched are the names whose change may let a failed try pass: every
// slot that may be held, the turn and the limit row.
func (m *Semaphore) watched(full *FullError) []string {
	names := make([]string, 0, full.slots+2)
	for i := range max(full.slots, m.limit) {
		names = append(names, m.slot(i))
	}
	return append(names, m.name+"#turn", m.name+"#limit")
}

// SetLimit stores the semaphore's limit in the database, for every
// process, and wakes its waiters. A lower limit revokes no permit: the
// permits held may then exceed it until enough are released, and no
// permit is granted while held + n would exceed it. limit must be in [1,
// [MaxSemaphoreLimit]]. ctx bounds the statement.
func (m *Semaphore) SetLimit(ctx context.Context, limit int) error {
	if err := m.inspectable(ctx); err != nil {
		return fmt.Errorf("semaphore %q: set limit: %w", short(m.Name()), err)
	}
	if err := checkLimit(limit); err != nil {
		return fmt.Errorf("semaphore %q: set limit: %w", short(m.name), err)
	}
	_, err := m.s.pool.Exec(ctx, m.s.mq.limit, m.name, limit, m.s.q.channel)
	if err != nil {
		return fmt.Errorf("semaphore %q: set limit: %w", short(m.name), err)
	}
	m.set.Store(int64(limit))
	return nil
}

// Limit returns the semaphore's limit as stored in the database, or the
// one given to [Store.Semaphore] while none is stored.
func (m *Semaphore) Limit(ctx context.Context) (int, error) {
	if err := m.inspectable(ctx); err != nil {
		return 0, fmt.Errorf("semaphore %q: limit: %w", short(m.Name()), err)
	}
	var limit int
	err := m.s.pool.QueryRow(ctx, m.s.mq.readLimit, m.name).Scan(&limit)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return m.limit, nil
	case err != nil:
		return 0, fmt.Errorf("semaphore %q: limit: %w", short(m.name), err)
	}
	return limit, nil
}

// Holders returns the permits held now, by the server clock, as [Info]
// (the slot's name, its holder and token), in token order. It is a plain
// read, which a standby serves too.
func (m *Semaphore) Holders(ctx context.Context) ([]Info, error) {
	if err := m.inspectable(ctx); err != nil {
		return nil, fmt.Errorf("semaphore %q: holders: %w", short(m.Name()), err)
	}
	rows, err := m.s.pool.Query(ctx, m.s.mq.holders, m.name, m.limit)
	if err != nil {
		return nil, fmt.Errorf("semaphore %q: holders: %w", short(m.name), err)
	}
	infos, err := pgx.CollectRows(rows, scanInfo)
	if err != nil {
		return nil, fmt.Errorf("semaphore %q: holders: %w", short(m.name), err)
	}
	return infos, nil
}

// Count returns the number of permits held now, by the server clock.
func (m *Semaphore) Count(ctx context.Context) (int, error) {
	if err := m.inspectable(ctx); err != nil {
		return 0, fmt.Errorf("semaphore %q: count: %w", short(m.Name()), err)
	}
	var n int
	if err := m.s.pool.QueryRow(ctx, m.s.mq.count, m.name, m.limit).Scan(&n); err != nil {
		return 0, fmt.Errorf("semaphore %q: count: %w", short(m.name), err)
	}
	return n, nil
}

// inspectable checks the receiver and ctx of SetLimit, Limit, Holders and
// Count.
func (m *Semaphore) inspectable(ctx context.Context) error {
	if err := m.usable(); err != nil {
		return err
	}
	if err := checkCtx(ctx); err != nil {
		return err
	}
	return m.s.checkOpen()
}
