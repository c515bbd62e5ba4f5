package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/internal/outcome"
)

// MaxSemaphoreLimit is the highest limit of a [Semaphore]: an acquisition
// reads up to this many slot rows, and a waiting Acquire watches them all.
const MaxSemaphoreLimit = 256

// ErrInvalidPermits is wrapped by the error for a permit count or limit
// out of range: n ≤ 0, n above the semaphore's limit, a limit ≤ 0 or
// above [MaxSemaphoreLimit].
var ErrInvalidPermits = errors.New("lease: invalid permit count")

// FullError is the error of a [Semaphore.TryAcquire] that found too few
// permits free: nothing was taken. errors.Is(err, ErrHeld) reports true
// for it.
type FullError struct {
	// Name is the semaphore's name.
	Name string
	// Want is the number of permits asked for.
	Want int
	// Held is the number of permits held when the try ran (it may exceed
	// Limit after the limit was lowered).
	Held int
	// Limit is the semaphore's limit as stored in the database.
	Limit int
	// Reserved is the number of permits reserved by a waiting
	// [Semaphore.Acquire] that holds the turn (0 when none, or when the
	// caller holds it).
	Reserved int
	// ExpiresIn is how long the permit (or turn) expiring first had left
	// by the server clock when the try ran.
	ExpiresIn time.Duration
	// Locked, when not 0, says there was room, but that many of the
	// semaphore's rows (free slots, or the limit row while grants
	// serialize on it) stayed locked by other transactions through
	// several tries — a Guard of an expired permit's lease, acquisitions
	// not yet committed — so the try could not take them.
	Locked int

	slots int // slot rows that may be held: the highest limit set
	asked int // the limit the Semaphore was given (made with, or SetLimit), if not Limit
}

// Error describes the semaphore's state.
func (e *FullError) Error() string {
	if e == nil {
		return "lease: nil *FullError"
	}
	msg := fmt.Sprintf("semaphore %q: %d of %d permits held, %d wanted", e.Name, e.Held, e.Limit, e.Want)
	if e.Locked > 0 {
		msg += fmt.Sprintf(", but %d of its rows stayed locked by other transactions", e.Locked)
	}
	if e.Reserved > 0 {
		msg += fmt.Sprintf(", %d reserved by a waiter's turn", e.Reserved)
	}
	if e.asked != 0 {
		msg += fmt.Sprintf(" (%s)", limitNote(e.Limit, e.asked))
	}
	return msg
}

// limitNote says that the stored limit, not the one a Semaphore was made
// with, is in force, and how to change it.
func limitNote(stored, asked int) string {
	return fmt.Sprintf("the limit stored in the table is %d, not the %d this Semaphore was given: Semaphore.SetLimit changes it", stored, asked)
}

// Is reports whether target is [ErrHeld].
func (e *FullError) Is(target error) bool { return target == ErrHeld }

// Semaphore is a counting semaphore whose permits are leases: at most
// Limit permits are held at a time, across every process that uses the
// same table and name. Make it with [Store.Semaphore]. Its methods are
// safe for concurrent use.
//
// Permit k is the lease row "<name>#k", for k in [0, limit); the limit is
// kept in the row "<name>#limit" and a waiter's turn in "<name>#turn":
// names of that form are the semaphore's, do not use them as leases. A
// permit has the slot row's token, which only grows, and renews, releases,
// fences and is lost as any [Lease] is.
type Semaphore struct {
	s     *Store
	name  string
	limit int // until one is stored

	set  atomic.Int64 // the limit this Semaphore last stored (SetLimit); 0: none
	told atomic.Bool  // the Logger was told that the stored limit differs

	slotsOnce sync.Once
	slots     []string // every slot name up to MaxSemaphoreLimit
}

// Semaphore returns the semaphore name of the store with limit, the limit
// used until one is stored in the database: the first acquisition stores
// it, [Semaphore.SetLimit] changes it, and from then on every process
// uses the stored limit, whatever it passed here. So a deploy that
// raises the number in its code changes nothing: Semaphore(name, 5) after
// 3 was stored grants 3 permits (a [*FullError] names both numbers, and
// the store's Logger says so at Info, once per Semaphore); call SetLimit
// to change it. (An advisory Semaphore has no table: there the largest
// limit in use bounds the count.) It does not touch the database. name must be a valid lease name short enough for its slot
// names ("<name>#limit" at most [MaxNameLen] bytes); limit in [1,
// [MaxSemaphoreLimit]].
func (s *Store) Semaphore(name string, limit int) (*Semaphore, error) {
	if err := s.usable(); err != nil {
		return nil, fmt.Errorf("semaphore: %w", err)
	}
	if name == "" {
		return nil, errors.New("semaphore: empty name")
	}
	if err := checkName(name + "#limit"); err != nil {
		return nil, fmt.Errorf("semaphore %q: %w (the name with its suffix \"#limit\")", short(name), err)
	}
	if err := checkLimit(limit); err != nil {
		return nil, fmt.Errorf("semaphore %q: %w", short(name), err)
	}
	return &Semaphore{s: s, name: name, limit: limit}, nil
}

func checkLimit(limit int) error {
	if limit <= 0 || limit > MaxSemaphoreLimit {
		return fmt.Errorf("%w: limit %d is outside [1, %d]", ErrInvalidPermits, limit, MaxSemaphoreLimit)
	}
	return nil
}

// usable returns an error for a nil or zero Semaphore.
func (m *Semaphore) usable() error {
	if m == nil {
		return errors.New("lease: nil *Semaphore")
	}
	if m.s == nil {
		return errors.New("lease: zero Semaphore: make it with Store.Semaphore")
	}
	return nil
}

// Name returns the semaphore's name ("" for a nil Semaphore).
func (m *Semaphore) Name() string {
	if m == nil {
		return ""
	}
	return m.name
}

// TryAcquire takes n permits for ttl if that many are free, all or none,
// in one statement and one round trip: the lowest free slots below the
// limit. Free means: the permits held (by anyone, in any slot, also above
// a lowered limit) plus n, plus the permits a waiting [Semaphore.Acquire]
// holding the turn reserves, do not exceed the limit. Otherwise the error
// is a [*FullError] (errors.Is ErrHeld) and the try locked and wrote
// nothing. A race lost to rows other transactions hold locked is retried
// a few times, then reported as a FullError with Locked set. n above the
// stored limit is an error wrapping [ErrInvalidPermits]. Unknown outcomes
// are handled as for
// [Store.TryAcquireAll]: every slot is cleaned up by the attempt's id in
// the background. The Observer sees one Acquire event named after the
// semaphore, and one Start per permit. ctx bounds the call.
func (m *Semaphore) TryAcquire(ctx context.Context, n int, ttl time.Duration, opts ...Option) (*Permits, error) {
	o, err := m.check(ctx, n, ttl, opts)
	if err != nil {
		return nil, fmt.Errorf("semaphore %q: try acquire: %w", short(m.Name()), err)
	}
	start := m.s.cfg.Now()
	p, _, err := m.try(ctx, n, ttl, o, uuid.Nil)
	return m.observe(false, start, p, err)
}

// check validates the arguments of TryAcquire and Acquire.
func (m *Semaphore) check(ctx context.Context, n int, ttl time.Duration, opts []Option) (options, error) {
	if err := m.usable(); err != nil {
		return options{}, err
	}
	if n <= 0 || n > MaxSemaphoreLimit {
		return options{}, fmt.Errorf("%w: n = %d is outside [1, %d]", ErrInvalidPermits, n, MaxSemaphoreLimit)
	}
	return m.s.check(ctx, m.name+"#limit", ttl, opts)
}

// try runs the semaphore's acquire statement once per attempt (see
// tryMulti), as the holder of the turn owned by turn (uuid.Nil: none).
func (m *Semaphore) try(ctx context.Context, n int, ttl time.Duration, o options, turn uuid.UUID) (*Permits, *FullError, error) {
	s := m.s
	host, meta := hostMeta(s.cfg, o)
	// Any slot below MaxSemaphoreLimit may be taken: the stored limit,
	// not m.limit, bounds them (see tryMulti, which cleans them up by
	// attempt id after an unknown outcome).
	m.slotsOnce.Do(func() {
		m.slots = make([]string, MaxSemaphoreLimit)
		for i := range m.slots {
			m.slots[i] = m.slot(i)
		}
	})
	maybe := m.slots
	var turnArg any
	if turn != uuid.Nil {
		turnArg = pgUUID(turn)
	}
	ls, res, err := s.tryMulti(ctx, maybe, ttl, o, func(ctx context.Context, db querier, attempt uuid.UUID) (multiResult, error) {
		rows, err := db.Query(ctx, s.mq.sem, m.name, m.limit, n, turnArg, pgUUID(o.owner), ttl.Microseconds(),
			host, int32(s.cfg.PID), meta, pgUUID(attempt), s.q.channel)
		if err != nil {
			return multiResult{}, err
		}
		return m.scan(rows, n)
	})
	switch {
	case err != nil:
		return nil, nil, err
	case res.full != nil && res.full.Want > res.full.Limit:
		return nil, res.full, outcome.MarkInvalid(fmt.Errorf("%w: n = %d is above the semaphore's limit %d", ErrInvalidPermits, n, res.full.Limit))
	case res.full != nil:
		return nil, res.full, res.full
	case res.lostFull != nil:
		return nil, res.lostFull, res.lostFull
	}
	return newPermits(m.name, ls), nil, nil
}

// scan reads the rows of the semaphore's acquire statement.
func (m *Semaphore) scan(rows pgx.Rows, n int) (multiResult, error) {
	defer rows.Close()
	var res multiResult
	for rows.Next() {
		var (
			kind                         string
			name                         *string
			token                        *int64
			exp                          *time.Time
			us                           int64
			held, lim, reserved, slotsNo int
		)
		if err := rows.Scan(&kind, &name, &token, &exp, &us, nil, &held, &lim, &reserved, &slotsNo); err != nil {
			return multiResult{}, err
		}
		d := time.Duration(us) * time.Microsecond
		switch kind {
		case "t":
			res.taken = append(res.taken, taken{name: *name, token: *token, expiresAt: *exp, lag: d})
		case "f":
			res.full = &FullError{Name: m.name, Want: n, Held: held, Limit: lim, Reserved: reserved, ExpiresIn: d, slots: slotsNo}
			m.noteLimit(res.full)
		default: // a lost race; us is the number of free slot rows it could not lock
			res.lostFull = &FullError{Name: m.name, Want: n, Held: held, Limit: lim, Reserved: reserved, Locked: max(int(us), 1), slots: slotsNo}
			m.noteLimit(res.lostFull)
		}
	}
	return res, rows.Err()
}

// noteLimit marks full with the limit m was made with when the stored
// limit differs, and tells the Logger so at Info, once per Semaphore.
func (m *Semaphore) noteLimit(full *FullError) {
	asked := m.limit
	if set := m.set.Load(); set != 0 {
		asked = int(set)
	}
	if full.Limit == asked || full.Limit <= 0 {
		return
	}
	full.asked = asked
	if !m.told.Swap(true) {
		m.s.cfg.Logger.Info("lease: semaphore: "+limitNote(full.Limit, asked), "semaphore", short(m.name),
			"stored_limit", full.Limit, "limit", asked)
	}
}

// slot is the lease name of permit i.
func (m *Semaphore) slot(i int) string { return m.name + "#" + strconv.Itoa(i) }

// observe reports a TryAcquire or Acquire call as one Acquire event named
// after the semaphore.
func (m *Semaphore) observe(wait bool, start time.Time, p *Permits, err error) (*Permits, error) {
	var first *Lease
	var full *FullError
	switch {
	case errors.As(err, &full) && err == error(full):
		p = nil // it names the semaphore
	case err != nil:
		verb := "try acquire"
		if wait {
			verb = "acquire"
		}
		err = fmt.Errorf("semaphore %q: %s: %w", short(m.name), verb, err)
		p = nil
	default:
		first = p.leases[0]
	}
	_, err = m.s.observeAcquire(m.name, wait, start, first, err)
	return p, err
}

// turnMeta is the metadata of the turn lease of a waiter for n permits.
func turnMeta(n int) json.RawMessage { return json.RawMessage(`{"n":` + strconv.Itoa(n) + `}`) }
