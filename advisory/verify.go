package advisory

import (
	"context"
	"fmt"
	"time"
)

// Verify checks the lock now with one round trip on its session (a bare
// protocol Sync, as the pings of an idle session are) and returns nil if
// the server answered it and the lock was still held: the session — and
// so the lock — was alive when that round trip was sent, after Verify was
// called, and [Lock.VerifiedAt] has moved to that send time. It says
// nothing of later: the lock can be lost the moment after.
//
// For a lock that was unlocked, lost or released by [Locker.Close] it
// returns an error wrapping [ErrNotHeld] (and then [ErrLost] or
// [ErrClosed]). A round trip that fails ends the session as a failed ping
// does: the lock is announced lost and Verify returns an error wrapping
// [ErrNotHeld] and [ErrLost]. ctx bounds only the wait: the round trip,
// once started, completes (within QueryTimeout) even if ctx ends first,
// and Verify then returns ctx's cause. The round trip waits its turn on
// the session, after any statement running there.
func (lk *Lock) Verify(ctx context.Context) error {
	if err := lk.unusable(); err != nil {
		return fmt.Errorf("advisory: verify: %w", err)
	}
	switch {
	case ctx == nil:
		return opErr("verify", lk.key, errNilContext)
	}
	if err := lk.heldErr(); err != nil {
		return opErr("verify", lk.key, err)
	}
	l := lk.l
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return opErr("verify", lk.key, fmt.Errorf("%w: %w", ErrNotHeld, ErrClosed))
	}
	l.wg.Add(1) // before Close's Wait: closed is set under l.mu first
	l.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer l.wg.Done()
		defer close(done)
		lk.sess.verify()
		l.deliver()
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return opErr("verify", lk.key, context.Cause(ctx))
	}
	return opErr("verify", lk.key, lk.heldErr())
}

// heldErr returns nil while lk is held, and else an error wrapping
// ErrNotHeld and, if the lock ended other than by Unlock, why.
func (lk *Lock) heldErr() error {
	lk.l.mu.Lock()
	defer lk.l.mu.Unlock()
	switch lk.state {
	case lockHeld:
		return nil
	case lockLost, lockClosed:
		return fmt.Errorf("%w: %w", ErrNotHeld, lk.err)
	}
	return fmt.Errorf("%w: %w", ErrNotHeld, errUnlocked)
}

// verify makes one round trip on the session, as its worker's ping does,
// once the statements ahead of it are done; a failed one ends the session
// (its locks are announced lost). The session's verified time then holds
// the round trip's send time.
func (s *session) verify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.isDead() {
		return
	}
	err := s.ping()
	s.lastUse = time.Now()
	if err != nil {
		s.die(fmt.Errorf("verify: %w", err))
	}
}
