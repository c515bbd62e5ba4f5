package advisory

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/pglocks/pglocks"
)

// MaxLimit is the largest limit of a [Semaphore].
const MaxLimit = 1024

// Semaphore is a counting semaphore on advisory locks: at most its limit
// of permits are held at once, by all processes that use its name. Make
// one with [Locker.Semaphore]. Permit slot i (0 ≤ i < limit) is the
// exclusive advisory lock on
//
//	pglocks.KeyOf("pglocks.sem:" + name + ":" + strconv.Itoa(i))
//
// that is, in SQL, hashtextextended('pglocks.sem:' || name || ':' || i, 0),
// and the turnstile is KeyOf("pglocks.sem:" + name + ":turnstile"); a
// client in another language that takes and releases slot locks the same
// way (pg_try_advisory_lock on a free slot; waiting for n>1 permits while
// holding the turnstile exclusively, taking one while holding it shared)
// interoperates. A Semaphore is safe for concurrent use.
type Semaphore struct {
	l         *Locker
	name      string
	label     pglocks.Key
	turnstile pglocks.Key

	mu    sync.Mutex
	limit int
	slots []pglocks.Key // the slot keys, at least limit of them
}

// Semaphore returns the semaphore name with the given limit, on l's
// sessions. It takes nothing and opens no session. limit is this
// handle's: see [Semaphore.SetLimit] for processes that disagree.
func (l *Locker) Semaphore(name string, limit int) (*Semaphore, error) {
	if l == nil {
		return nil, fmt.Errorf("advisory: semaphore: %w", errNilLocker)
	}
	if err := checkSemaphore(name, limit); err != nil {
		return nil, fmt.Errorf("advisory: semaphore %q: %w", name, err)
	}
	sem := &Semaphore{l: l, name: name, label: pglocks.KeyOf(semPrefix + name),
		turnstile: TurnstileKey(name)}
	sem.setLimit(limit)
	return sem, nil
}

// semPrefix starts the names of a Semaphore's keys.
const semPrefix = "pglocks.sem:"

// TurnstileKey returns the key of the turnstile of the semaphore name.
func TurnstileKey(name string) pglocks.Key {
	return pglocks.KeyOf(semPrefix + name + ":turnstile")
}

// SlotKey returns the key of permit slot i of the semaphore name.
func SlotKey(name string, i int) pglocks.Key {
	return pglocks.KeyOf(semPrefix + name + ":" + strconv.Itoa(i))
}

func checkSemaphore(name string, limit int) error {
	if err := pglocks.ValidateName(name); err != nil {
		return err
	}
	return checkLimit(limit)
}

func checkLimit(limit int) error {
	if limit <= 0 || limit > MaxLimit {
		return fmt.Errorf("limit %d out of range: want 1 to MaxLimit (%d)", limit, MaxLimit)
	}
	return nil
}

func (sem *Semaphore) setLimit(limit int) {
	sem.mu.Lock()
	defer sem.mu.Unlock()
	for i := len(sem.slots); i < limit; i++ {
		sem.slots = append(sem.slots, SlotKey(sem.name, i))
	}
	sem.limit = limit
}

// SetLimit changes this handle's limit (1 to [MaxLimit]); it takes effect
// for the acquisitions that start after it. Advisory locks have no table
// to store a limit in, so each handle, in each process, has its own: a
// handle grants only slots below its limit. Where handles disagree, the
// bound in force is the largest limit in use; after a limit is lowered,
// the slots at or above it are not granted anew by that handle, and
// permits already held on them are never revoked: the count drains to the
// new limit as they are released.
func (sem *Semaphore) SetLimit(limit int) error {
	if sem.unusable() != nil {
		return fmt.Errorf("advisory: semaphore: set limit: %w", sem.unusable())
	}
	if err := checkLimit(limit); err != nil {
		return fmt.Errorf("advisory: semaphore %q: set limit: %w", sem.name, err)
	}
	sem.setLimit(limit)
	return nil
}

// Limit returns this handle's limit (0 for a nil Semaphore).
func (sem *Semaphore) Limit() int {
	if sem.unusable() != nil {
		return 0
	}
	sem.mu.Lock()
	defer sem.mu.Unlock()
	return sem.limit
}

// Name returns the semaphore's name.
func (sem *Semaphore) Name() string {
	if sem == nil {
		return ""
	}
	return sem.name
}

func (sem *Semaphore) unusable() error {
	switch {
	case sem == nil:
		return errors.New("nil *Semaphore")
	case sem.l == nil:
		return errors.New("zero Semaphore (make one with Locker.Semaphore)")
	}
	return nil
}

// TryAcquire takes n permits, all or none, if n slots are free, in one
// statement on one session (one permit: one statement per 4 free slots of
// this process tried, while they are busy elsewhere), and fails with an
// error wrapping [ErrLocked] otherwise (`advisory: semaphore "exports":
// no permit of 3 free`; a failed try learns no count: [Semaphore.Count]
// reads it) — also while a [Semaphore.Acquire] of more than one permit
// gathers (it holds the turnstile), so that a stream of tries does not
// starve it. n must be 1 to the handle's limit. A failed try leaves
// nothing held. Other errors as for [Locker.TryLock].
func (sem *Semaphore) TryAcquire(ctx context.Context, n int) (*Permits, error) {
	return sem.acquire(ctx, "tryacquire", n, false)
}

// Acquire takes n permits, all or none, waiting until n slots are free or
// ctx ends. It waits as [Locker.Lock] does, never on the server: it
// retries the one-statement try, woken when a permit is released (by
// NOTIFY from another process, at once in this one; else by backoff, up
// to MaxBackoff). Acquire of one permit passes the turnstile shared for
// its statement only; Acquire of n > 1 takes the turnstile exclusively
// (waiting for other such gatherers), so that new takers stop while it
// gathers, and releases it once it holds its n permits or gives up: a
// stream of single takers cannot starve it. A permit's slot lock dies
// with its session: the permits of a crashed process are free at once.
func (sem *Semaphore) Acquire(ctx context.Context, n int) (*Permits, error) {
	return sem.acquire(ctx, "acquire", n, true)
}

func (sem *Semaphore) acquire(ctx context.Context, op string, n int, wait bool) (*Permits, error) {
	if err := sem.unusable(); err != nil {
		return nil, fmt.Errorf("advisory: semaphore %s: %w", op, err)
	}
	what := fmt.Sprintf("%q %s %d", sem.name, op, n)
	m, bySlot, err := sem.plan(n)
	if err == nil {
		err = sem.l.check(ctx, sem.label)
	}
	if err != nil {
		return nil, opErrOn("semaphore", what, err)
	}
	start := time.Now()
	var gate *Lock
	if wait && n > 1 {
		if gate, err = sem.l.Lock(ctx, sem.turnstile); err != nil {
			return nil, opErrOn("semaphore", what, fmt.Errorf("turnstile: %w", err))
		}
		m.turnstile = pglocks.Key{}
	}
	taken, err := sem.l.runMulti(ctx, m, wait)
	if gate != nil {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sem.l.cfg.QueryTimeout)
		_ = gate.Unlock(uctx) // a turnstile left held is freed with its session
		cancel()
	}
	var lk *Lock
	if len(taken) > 0 {
		lk = taken[0]
	}
	switch {
	case err == ErrLocked: // a try found too few free: say so as the semaphore's
		err = opErrOn("semaphore", strconv.Quote(sem.name), &semBusyError{want: n, limit: len(m.keys)})
	case err != nil:
		err = opErrOn("semaphore", what, err)
	}
	if _, err = sem.l.observeAcquire(sem.label, false, wait, start, lk, err); err != nil {
		return nil, err
	}
	slots := make([]int, len(taken))
	for i, lk := range taken {
		slots[i] = bySlot[idOf(lk.key)]
	}
	return &Permits{sem: sem, locks: newLocks(taken), slots: slots}, nil
}

// semBusyError is why a [Semaphore.TryAcquire] took nothing: fewer than
// want of the limit's permits were free to it — held, or kept for a
// waiter for several that holds the turnstile. Advisory locks tell a
// failed try no more: how many are held takes a read of pg_locks
// ([Semaphore.Count]).
type semBusyError struct{ want, limit int }

func (e *semBusyError) Error() string {
	if e.want == 1 {
		return fmt.Sprintf("no permit of %d free", e.limit)
	}
	return fmt.Sprintf("fewer than %d of %d permits free", e.want, e.limit)
}

func (e *semBusyError) Unwrap() error { return ErrLocked }

// plan returns the multi that takes n of the slots below the limit, from
// a random one on (so that takers spread over the slots), and each slot
// key's number.
func (sem *Semaphore) plan(n int) (*multi, map[keyID]int, error) {
	sem.mu.Lock()
	defer sem.mu.Unlock()
	if n <= 0 || n > sem.limit {
		return nil, nil, fmt.Errorf("n = %d: want 1 to the limit (%d)", n, sem.limit)
	}
	keys := make([]pglocks.Key, sem.limit)
	bySlot := make(map[keyID]int, sem.limit)
	first := rand.N(sem.limit)
	for i := range keys {
		slot := (first + i) % sem.limit
		keys[i] = sem.slots[slot]
		bySlot[idOf(keys[i])] = slot
	}
	return &multi{keys: keys, need: n, turnstile: sem.turnstile, label: sem.label, semName: sem.label.String()}, bySlot, nil
}

// Permits are permits of a [Semaphore] taken together, all on one
// session: they are lost together. Release them with [Permits.Release].
type Permits struct {
	sem   *Semaphore
	locks *Locks
	slots []int
}

func (p *Permits) unusable() error {
	switch {
	case p == nil:
		return errors.New("nil *Permits")
	case p.sem == nil:
		return errors.New("zero Permits (they come from a Semaphore)")
	}
	return nil
}

// N returns how many permits p holds (0 for nil Permits).
func (p *Permits) N() int {
	if p.unusable() != nil {
		return 0
	}
	return len(p.slots)
}

// Slots returns the slot numbers of the permits, in the order taken.
func (p *Permits) Slots() []int {
	if p.unusable() != nil {
		return nil
	}
	return append([]int(nil), p.slots...)
}

// PID returns the server process id of the session that holds them.
func (p *Permits) PID() uint32 {
	if p.unusable() != nil {
		return 0
	}
	return p.locks.PID()
}

// VerifiedAt returns the send time of the latest round trip on the
// permits' session that the server answered (see [Lock.VerifiedAt]).
func (p *Permits) VerifiedAt() time.Time {
	if p.unusable() != nil {
		return time.Time{}
	}
	return p.locks.VerifiedAt()
}

// Lost returns a channel closed when the permits are lost: their session
// died, or [Locker.Close] released them ([Permits.Err] says which). A nil
// or zero Permits's is closed.
func (p *Permits) Lost() <-chan struct{} {
	if p.unusable() != nil {
		return closedChan
	}
	return p.locks.Lost()
}

// Context returns a context cancelled when the permits end: on loss (the
// cause wraps [ErrLost] or [ErrClosed]) or on Release.
func (p *Permits) Context() context.Context {
	if p.unusable() != nil {
		return (*Locks)(nil).Context()
	}
	return p.locks.Context()
}

// Err returns nil while the permits are held or after their release, and
// why they ended otherwise.
func (p *Permits) Err() error {
	if err := p.unusable(); err != nil {
		return err
	}
	return p.locks.Err()
}

// Release gives the permits back (see [Locks.Unlock]); a second Release
// returns an error wrapping [ErrNotHeld]. ctx bounds the wait only.
func (p *Permits) Release(ctx context.Context) error {
	if err := p.unusable(); err != nil {
		return fmt.Errorf("advisory: release: %w", err)
	}
	if err := p.locks.Unlock(ctx); err != nil {
		return fmt.Errorf("advisory: semaphore %q: release: %w", p.sem.name, err)
	}
	return nil
}
