package advisory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pglocks/pglocks"
)

// MaxKeys is the most keys [Locker.TryLockAll] and [Locker.LockAll] take
// in one call.
const MaxKeys = 64

// TryLockAll takes the exclusive locks on all of keys, or none, in one
// round trip on one session: one statement tries them in sorted order and,
// if any is held elsewhere, unlocks those it took before it answers, so a
// failed TryLockAll leaves nothing held, here or on the server. It fails
// with an error wrapping [ErrLocked] if any key is held by another
// session or by a Lock of this process; a key that another TryLockAll or
// LockAll of this process is trying at that moment is waited for (one
// round trip), not reported busy. Keys must be valid and distinct, 1 to
// [MaxKeys] of them. Other errors are as for [Locker.TryLock]; a try whose
// reply never came closes its session, which frees whatever it took.
func (l *Locker) TryLockAll(ctx context.Context, keys ...pglocks.Key) (*Locks, error) {
	return l.acquireAll(ctx, "trylockall", keys, false)
}

// LockAll takes the exclusive locks on all of keys, waiting until it can
// take them all at once, or ctx ends. It repeats TryLockAll's
// one-statement try, woken as [Locker.Lock] is (by the unlock of any of
// its keys, else by backoff), and holds nothing while it waits, so two
// callers asking for overlapping sets in any order never deadlock. It
// does not queue: a caller that needs many keys can be passed over by
// callers that need fewer of them (use a [Semaphore] with a turnstile, or
// a lock that orders the callers, when that matters). Bad input and
// errors as for TryLockAll and [Locker.Lock].
func (l *Locker) LockAll(ctx context.Context, keys ...pglocks.Key) (*Locks, error) {
	return l.acquireAll(ctx, "lockall", keys, true)
}

func (l *Locker) acquireAll(ctx context.Context, op string, keys []pglocks.Key, wait bool) (*Locks, error) {
	sorted, err := checkKeys(keys)
	var first pglocks.Key
	if len(sorted) > 0 {
		first = sorted[0]
	}
	if err == nil {
		err = l.check(ctx, first)
	}
	if err != nil {
		return nil, opErrOn(op, keysLabel(keys), err)
	}
	start := time.Now()
	taken, err := l.runMulti(ctx, &multi{keys: sorted, need: len(sorted), label: first}, wait)
	var lk *Lock
	if len(taken) > 0 {
		lk = taken[0]
	}
	if err != nil {
		err = opErrOn(op, keysLabel(keys), err) // which key was busy is not known
	}
	if _, err = l.observeAcquire(first, false, wait, start, lk, err); err != nil {
		return nil, err
	}
	return newLocks(taken), nil
}

// keysLabel names a set of keys in an error: how many, and the first
// three in the caller's order ("" for none).
func keysLabel(keys []pglocks.Key) string {
	const show = 3
	if len(keys) == 0 {
		return ""
	}
	parts := make([]string, 0, show+1)
	for _, k := range keys[:min(len(keys), show)] {
		parts = append(parts, k.String())
	}
	if len(keys) > show {
		parts = append(parts, fmt.Sprintf("and %d more", len(keys)-show))
	}
	noun := "keys"
	if len(keys) == 1 {
		noun = "key"
	}
	return fmt.Sprintf("of %d %s (%s)", len(keys), noun, strings.Join(parts, ", "))
}

// runMulti tries m until it takes its keys or decide says to return.
func (l *Locker) runMulti(ctx context.Context, m *multi, wait bool) ([]*Lock, error) {
	a := &attempt{l: l, ctx: ctx, key: m.label, id: idOf(m.label), wait: wait, call: l.beginCall(),
		busy: l.cfg.MinBackoff, m: m}
	err := a.run()
	return a.taken, err
}

// checkKeys returns keys sorted by space and value, or why they are not a
// set of 1 to MaxKeys valid, distinct keys.
func checkKeys(keys []pglocks.Key) ([]pglocks.Key, error) {
	switch {
	case len(keys) == 0:
		return nil, errors.New("no keys")
	case len(keys) > MaxKeys:
		return nil, fmt.Errorf("%d keys, more than MaxKeys (%d)", len(keys), MaxKeys)
	}
	for i, k := range keys {
		if err := k.Validate(); err != nil {
			return nil, fmt.Errorf("key %d: %w", i, err)
		}
	}
	sorted := slices.Clone(keys)
	slices.SortFunc(sorted, func(a, b pglocks.Key) int {
		return cmp.Or(cmp.Compare(a.Space(), b.Space()), cmp.Compare(a.Int64(), b.Int64()))
	})
	for i := 1; i < len(sorted); i++ {
		if idOf(sorted[i]) == idOf(sorted[i-1]) {
			return sorted, fmt.Errorf("duplicate key %s", sorted[i])
		}
	}
	return sorted, nil
}

// Locks is a set of exclusive locks taken together by [Locker.TryLockAll]
// or [Locker.LockAll], all on one session: they are lost together. Release
// them with [Locks.Unlock]. A Locks is safe for concurrent use.
type Locks struct {
	locks  []*Lock
	ctx    context.Context
	cancel context.CancelCauseFunc
	lost   chan struct{}
	once   sync.Once
}

// newLocks groups locks taken together: its context ends when the first of
// them ends, and Lost closes when one is lost.
func newLocks(locks []*Lock) *Locks {
	ctx, cancel := context.WithCancelCause(context.Background())
	ls := &Locks{locks: locks, ctx: ctx, cancel: cancel, lost: make(chan struct{})}
	for _, lk := range locks {
		context.AfterFunc(lk.ctx, func() {
			if lk.Err() != nil {
				ls.once.Do(func() { close(ls.lost) })
			}
			cancel(context.Cause(lk.ctx))
		})
	}
	return ls
}

func (ls *Locks) unusable() error {
	switch {
	case ls == nil:
		return errors.New("nil *Locks")
	case ls.ctx == nil:
		return errors.New("zero Locks (they come from a Locker)")
	}
	return nil
}

// Keys returns the keys held, sorted (nil for a nil Locks).
func (ls *Locks) Keys() []pglocks.Key {
	if ls.unusable() != nil {
		return nil
	}
	keys := make([]pglocks.Key, len(ls.locks))
	for i, lk := range ls.locks {
		keys[i] = lk.key
	}
	return keys
}

// PID returns the server process id of the session that holds the locks.
func (ls *Locks) PID() uint32 {
	if ls.unusable() != nil || len(ls.locks) == 0 {
		return 0
	}
	return ls.locks[0].pid
}

// VerifiedAt returns the send time of the latest round trip on the locks'
// session that the server answered (see [Lock.VerifiedAt]); zero for a
// nil Locks.
func (ls *Locks) VerifiedAt() time.Time {
	if ls.unusable() != nil || len(ls.locks) == 0 {
		return time.Time{}
	}
	return ls.locks[0].VerifiedAt()
}

// Lost returns a channel closed when the locks are lost: their session
// died, or [Locker.Close] released them ([Locks.Err] says which). It stays
// open after a successful Unlock. A nil or zero Locks's is closed.
func (ls *Locks) Lost() <-chan struct{} {
	if ls.unusable() != nil {
		return closedChan
	}
	return ls.lost
}

// Context returns a context cancelled when the first of the locks ends:
// on loss (the cause wraps [ErrLost] or [ErrClosed]) or on Unlock.
func (ls *Locks) Context() context.Context {
	if err := ls.unusable(); err != nil {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(err)
		return ctx
	}
	return ls.ctx
}

// Err returns nil while the locks are held or after they were unlocked,
// and why they ended otherwise (see [Lock.Err]).
func (ls *Locks) Err() error {
	if err := ls.unusable(); err != nil {
		return err
	}
	for _, lk := range ls.locks {
		if err := lk.Err(); err != nil {
			return err
		}
	}
	return nil
}

// Unlock releases every lock of the set, pipelined on their session, and
// returns the errors of those that failed (each as [Lock.Unlock]'s; a
// lock still held can be released by calling Unlock again, which then
// reports [ErrNotHeld] for the others). ctx bounds the wait only.
func (ls *Locks) Unlock(ctx context.Context) error {
	if err := ls.unusable(); err != nil {
		return fmt.Errorf("advisory: unlock all: %w", err)
	}
	if ctx == nil {
		return fmt.Errorf("advisory: unlock all: %w", errNilContext)
	}
	errs := make([]error, len(ls.locks))
	var wg sync.WaitGroup
	for i, lk := range ls.locks[1:] {
		wg.Go(func() { errs[i+1] = lk.Unlock(ctx) })
	}
	if len(ls.locks) > 0 {
		errs[0] = ls.locks[0].Unlock(ctx) // on this goroutine: a single permit needs no other
	}
	wg.Wait()
	return errors.Join(errs...)
}
