package advisory

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pglocks/pglocks"
)

type lockState uint8

const (
	lockHeld lockState = iota
	lockUnlocking
	lockUnlocked
	lockLost
	lockClosed
)

// Lock is one held session advisory lock, as returned by [Locker.Lock],
// [Locker.TryLock], [Locker.RLock] and [Locker.TryRLock]. Release it with
// [Lock.Unlock]; watch [Lock.Lost] (or [Lock.Context]) to learn that it was
// lost. A Lock is safe for concurrent use.
type Lock struct {
	l      *Locker
	key    pglocks.Key
	shared bool
	obs    string // its name for the Observer when not the key's: its Semaphore's
	sess   *session
	pid    uint32
	at     time.Time // when the hold began, for metrics and logs

	ctx    context.Context // cancelled when the lock ends
	cancel context.CancelCauseFunc
	lost   chan struct{} // closed when the lock ends other than by Unlock

	frozen atomic.Int64 // VerifiedAt once the lock ended, plus 1; 0 while it is held
	state  lockState    // guarded by l.mu
	err    error        // guarded by l.mu: why it ended, if not by Unlock
}

// VerifiedAt returns the send time of the latest round trip on the lock's
// session that the server answered (a statement, or the ping a session
// holding locks gets every PingInterval), as a reading of the monotonic
// clock. The session — and so the lock — was alive at that instant: a
// holder that must not act on a lock it may have lost can trust it until
// VerifiedAt plus a grace longer than PingInterval and a round trip, as
// package leader does. It keeps its last value once the lock has ended.
func (lk *Lock) VerifiedAt() time.Time {
	if lk.unusable() != nil {
		return time.Time{}
	}
	if v := lk.frozen.Load(); v != 0 {
		return monoBase.Add(time.Duration(v - 1))
	}
	return monoBase.Add(time.Duration(lk.sess.verified.Load()))
}

// newLock makes the Lock for a key just taken on s and registers it there.
// It takes over the caller's in-process reservation.
func (l *Locker) newLock(s *session, key pglocks.Key, shared bool) *Lock {
	return l.newLockNamed(s, key, shared, "")
}

// newLockNamed is newLock for a lock the Observer knows as obs (if not
// empty) rather than by its key.
func (l *Locker) newLockNamed(s *session, key pglocks.Key, shared bool, obs string) *Lock {
	ctx, cancel := context.WithCancelCause(context.Background())
	lk := &Lock{l: l, key: key, shared: shared, obs: obs, sess: s, pid: s.pid, ctx: ctx, cancel: cancel, lost: make(chan struct{}), at: l.observeStart(key, obs)}
	l.mu.Lock()
	s.locks[lk] = struct{}{}
	s.nlocks.Store(int32(len(s.locks)))
	l.mu.Unlock()
	return lk
}

// endLocked ends the lock: it frees the reservation, wakes waiters in this
// process and, unless st is lockUnlocked, announces the end on Lost with
// cause err. l.mu must be held.
func (lk *Lock) endLocked(st lockState, err error) {
	if lk.state != lockHeld && lk.state != lockUnlocking {
		return
	}
	lk.state = st
	// Later round trips on the session (other locks' pings and tries) say
	// nothing of this lock: VerifiedAt keeps the value it had now.
	lk.frozen.Store(lk.sess.verified.Load() + 1)
	lk.err = err
	lk.observeEnd(st, err)
	id := idOf(lk.key)
	lk.l.unreserveLocked(id, lk.shared)
	lk.l.wakeLocked(id)
	if st == lockUnlocked {
		lk.cancel(errUnlocked)
	} else {
		lk.cancel(err)
		close(lk.lost)
	}
}

var errUnlocked = errors.New("advisory: unlocked")

var (
	errNilLock  = errors.New("nil *Lock")
	errZeroLock = errors.New("zero Lock (locks come from a Locker)")
)

// unusable says why lk, nil or the zero Lock, is no lock; nil for a Lock a
// Locker made.
func (lk *Lock) unusable() error {
	switch {
	case lk == nil:
		return errNilLock
	case lk.l == nil:
		return errZeroLock
	}
	return nil
}

// Key returns the key the lock holds (the zero Key for a nil Lock).
func (lk *Lock) Key() pglocks.Key {
	if lk == nil {
		return pglocks.Key{}
	}
	return lk.key
}

// Shared reports whether the lock is shared (RLock) rather than exclusive.
func (lk *Lock) Shared() bool { return lk != nil && lk.shared }

// PID returns the server process id (pg_backend_pid) of the session that
// holds the lock, as shown by pg_locks and pg_stat_activity (0 for a nil
// Lock).
func (lk *Lock) PID() uint32 {
	if lk == nil {
		return 0
	}
	return lk.pid
}

// Lost returns a channel that is closed when the lock ends other than by
// [Lock.Unlock]: its session died (see [ErrLost]) or [Locker.Close]
// released it (see [ErrClosed]). [Lock.Err] then says which. The channel
// stays open after a successful Unlock. A nil or zero Lock holds nothing:
// its channel is closed.
func (lk *Lock) Lost() <-chan struct{} {
	if lk.unusable() != nil {
		return closedChan
	}
	return lk.lost
}

// closedChan is the Lost channel of a nil or zero Lock.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// Context returns a context that is cancelled when the lock ends: on loss,
// with a cause wrapping [ErrLost] or [ErrClosed] (see context.Cause), and
// also on Unlock. Use it to bound work that must run only under the lock.
// A nil or zero Lock's is cancelled, with the cause Err returns.
func (lk *Lock) Context() context.Context {
	if err := lk.unusable(); err != nil {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(err)
		return ctx
	}
	return lk.ctx
}

// Err returns nil while the lock is held or after it was unlocked, and why
// it ended otherwise: an error wrapping [ErrLost] or [ErrClosed]. For a
// nil or zero Lock it returns an error saying so.
func (lk *Lock) Err() error {
	if err := lk.unusable(); err != nil {
		return err
	}
	lk.l.mu.Lock()
	defer lk.l.mu.Unlock()
	return lk.err
}

// Unlock releases the lock, on the session that holds it. Afterwards the key
// is free on the server (unless other holders share it). A second Unlock, or
// one after the lock was lost or released by Close, returns an error
// wrapping [ErrNotHeld] (and then [ErrLost] or [ErrClosed]).
//
// ctx bounds only the wait for the server's answer: the release is queued
// at once and completes even if ctx ends first, in which case Unlock returns
// ctx's error. If the server answers the unlock with an error (an
// operator's pg_cancel_backend, say), the Locker reads pg_locks to learn
// whether it unlocked: if so Unlock returns nil, else the error, and the
// lock stays held, so Unlock can be called again.
func (lk *Lock) Unlock(ctx context.Context) error {
	switch {
	case lk.unusable() != nil:
		return fmt.Errorf("advisory: unlock: %w", lk.unusable())
	case ctx == nil:
		return opErr("unlock", lk.key, errNilContext)
	}
	lk.l.mu.Lock()
	switch lk.state {
	case lockHeld:
		lk.state = lockUnlocking
	case lockLost, lockClosed:
		err := lk.err
		lk.l.mu.Unlock()
		return opErr("unlock", lk.key, fmt.Errorf("%w: %w", ErrNotHeld, err))
	default:
		lk.l.mu.Unlock()
		return opErr("unlock", lk.key, ErrNotHeld)
	}
	lk.l.mu.Unlock()
	r := newRequest(opUnlock, lk.key, lk.shared)
	r.lock = lk
	ran, err := lk.sess.runDirect(ctx, r)
	if !ran {
		err = lk.sess.submit(ctx, r)
	}
	if err != nil {
		var ab errAbandoned
		if errors.As(err, &ab) {
			return opErr("unlock", lk.key, fmt.Errorf("%w (the release goes on in the background)", ab.err))
		}
		// The session stopped before the unlock was queued: it died (the
		// lock is lost) or Close released it.
		if lerr := lk.Err(); lerr != nil {
			return opErr("unlock", lk.key, fmt.Errorf("%w: %w", ErrNotHeld, lerr))
		}
		return opErr("unlock", lk.key, err)
	}
	return opErr("unlock", lk.key, r.err)
}
