package advisory

import (
	"context"
	"errors"
	"fmt"

	"github.com/pglocks/pglocks"
)

// A multi (see multi) reserves, for one round trip, every one of its keys
// that no Lock of this process holds, and sends those: a key held here is
// busy for it, as it is for TryLock. A key another multi of this process
// has reserved for its round trip is neither free nor held: a multi that
// would take too few keys without it waits for that round trip to end
// (reserveFree), so that two tries of one process never report each
// other busy. Nothing is reserved between rounds, so a waiting multi
// holds nothing, here or on the server, while it waits: no deadlock
// between callers asking for overlapping sets in any order.

// onceAll is attempt.once for a multi: it reserves keys free in this
// process, and when there are enough, tries them in one statement. A
// multi that needs one key (a Semaphore's single permit) and does not ask
// sends at most oneChunk keys a statement, and tries the next free ones
// while those are busy on the server: concurrent single takers of one
// process then reserve different slots instead of waiting for each
// other's round trip.
func (a *attempt) onceAll(ask bool) (bool, error) {
	chunk := len(a.m.keys)
	if a.m.need == 1 && !ask {
		chunk = oneChunk
	}
	var tried map[keyID]bool
	for {
		keys, err := a.l.reserveFree(a.ctx, a.m, tried, chunk)
		if err != nil || keys == nil {
			return false, err // busy here, or on the server for every key tried
		}
		ok, err := a.tryKeys(keys, ask)
		if ok || err != nil || chunk == len(a.m.keys) {
			return ok, err
		}
		if tried == nil {
			tried = map[keyID]bool{}
		}
		for _, k := range keys {
			tried[idOf(k)] = true
		}
	}
}

// oneChunk is how many keys a single-key multi sends a statement.
const oneChunk = 4

// tryKeys runs m on keys, reserved for it, in one statement.
func (a *attempt) tryKeys(keys []pglocks.Key, ask bool) (bool, error) {
	s, err := a.l.pickSession(a.ctx, a.wait, a.call)
	if err != nil {
		a.l.unreserveKeys(keys)
		return false, err
	}
	m := *a.m
	m.keys = keys
	r := newRequest(opTryAll, m.label, false)
	r.m, r.want = &m, ask
	ran, err := s.runDirect(a.ctx, r)
	if !ran {
		err = s.submit(a.ctx, r)
	}
	if err != nil {
		if !errors.As(err, new(errAbandoned)) {
			a.l.unreserveKeys(keys) // never queued: still ours
		}
		return false, err
	}
	if r.taken == nil {
		a.l.unreserveKeys(keys)
		return false, r.err
	}
	a.taken = r.taken
	return true, nil
}

// reserveFree reserves, exclusively, up to chunk of m's keys that are
// free in this process and not in tried; nil when fewer than m.need are.
// When too few are free but some of the others are only reserved by
// another multi's round trip, it waits for those to end (or ctx, or
// Close) and looks again.
func (l *Locker) reserveFree(ctx context.Context, m *multi, tried map[keyID]bool, chunk int) ([]pglocks.Key, error) {
	need := m.need
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, ErrClosed
		}
		if ks := l.keys[idOf(m.turnstile)]; m.turnstile.Space() != 0 && ks != nil && (ks.writer || len(ks.queue) > 0) {
			// A gatherer of this process holds or waits for the turnstile:
			// on its own session the server would let us pass it.
			l.mu.Unlock()
			return nil, nil
		}
		free, pending := l.freeLocked(m.keys, tried, chunk)
		if len(free) < need && len(pending) == 0 {
			l.mu.Unlock()
			return nil, nil // busy: held by this process's Locks
		}
		if len(free) >= need {
			for _, k := range free {
				id := idOf(k)
				ks := l.stateLocked(id)
				l.recallAskLocked(id, ks)
				ks.writer, ks.inflight = true, true
			}
			l.mu.Unlock()
			return free, nil
		}
		ch := make(chan struct{}, 1)
		for _, id := range pending {
			ks := l.keys[id]
			ks.settle = append(ks.settle, ch)
		}
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		case <-l.closing:
		}
		l.dropSettle(ch, pending)
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
	}
}

// freeLocked returns up to chunk keys of keys, not in tried, that nobody
// here holds, reserves or waits for, and the ids of those only a multi's
// round trip reserves.
func (l *Locker) freeLocked(keys []pglocks.Key, tried map[keyID]bool, chunk int) (free []pglocks.Key, pending []keyID) {
	for _, k := range keys {
		id := idOf(k)
		ks := l.keys[id]
		switch {
		case tried[id]:
		case len(free) == chunk:
			return free, pending
		case ks == nil || len(ks.queue) == 0 && !ks.writer && ks.readers == 0:
			free = append(free, k)
		case ks.inflight:
			pending = append(pending, id)
		}
	}
	return free, pending
}

// dropSettle forgets ch in the settle lists of ids.
func (l *Locker) dropSettle(ch chan struct{}, ids []keyID) {
	l.dropChan(ch, ids, func(ks *keyState) *[]chan struct{} { return &ks.settle })
}

// settledLocked ends id's round-trip reservation (it became a Lock, or is
// given back) and wakes the multis that waited for it.
func (l *Locker) settledLocked(id keyID) {
	ks := l.keys[id]
	if ks == nil || !ks.inflight {
		return
	}
	ks.inflight = false
	for _, ch := range ks.settle {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	ks.settle = nil
}

// unreserveKeys gives back a multi's reservations of keys.
func (l *Locker) unreserveKeys(keys []pglocks.Key) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		id := idOf(k)
		l.settledLocked(id)
		l.unreserveLocked(id, false)
	}
}

// tookAll makes the Locks of a multi that took its keys (the positions
// extra lists), gives back the reservations of the keys it did not need,
// and hands the Locks to the caller, or unlocks them if the caller left.
// An answer that does not say which keys were taken is a reply that
// cannot be trusted: the session is closed, as for a lost reply.
func (s *session) tookAll(r *request, extra []byte) error {
	pos, ok := takenPositions(extra, len(r.m.keys))
	if !ok || len(pos) != r.m.need {
		return s.failDead(r, fmt.Errorf("try all: unexpected answer %q", extra))
	}
	in := make([]bool, len(r.m.keys))
	taken := make([]*Lock, 0, len(pos))
	for _, p := range pos {
		in[p] = true
		if r.m.semName != "" {
			taken = append(taken, s.l.newLockNamed(s, r.m.keys[p], false, r.m.semName))
		} else {
			taken = append(taken, s.l.newLock(s, r.m.keys[p], false))
		}
	}
	var rest []pglocks.Key
	s.l.mu.Lock()
	for i, k := range r.m.keys {
		if in[i] {
			s.l.settledLocked(idOf(k))
		} else {
			rest = append(rest, k)
		}
	}
	s.l.mu.Unlock()
	s.l.unreserveKeys(rest)
	r.taken = taken
	if r.finish() {
		return nil
	}
	for _, lk := range taken {
		if err := s.undo(lk); err != nil {
			return err // the session died: it freed the rest
		}
	}
	return nil
}

// settleAll is settle for a multi: the statement failed on the server,
// perhaps after it took some of the keys (session locks ignore the
// rollback) and before it could give them back. Every key the session
// holds by pg_locks is unlocked (no Lock of this process holds any of
// them: they are reserved for r), and the error returned; the session is
// closed only when that cannot be done.
func (s *session) settleAll(r *request, cause error) error {
	failed := fmt.Errorf("%s failed: %w", r.kind, cause)
	for _, k := range r.m.keys {
		held, err := s.holdsKey(k, false)
		if err == nil && held {
			err = s.unlockKey(k)
		}
		if err != nil {
			return s.failDead(r, fmt.Errorf("%w; could not give back what it took, so the session is closed: %w", failed, err))
		}
	}
	r.err = failed
	s.finishOrUndo(r)
	return nil
}

// unlockKey unlocks key, held exclusively once by the session and by no
// Lock. s.mu must be held.
func (s *session) unlockKey(key pglocks.Key) error {
	var rep reply
	err := s.send(s.stmtArgs(stmtUnlock, key, false, false))
	if err == nil {
		err = s.recv(context.Background(), &rep)
	}
	if err == nil && rep.pgErr != nil {
		err = rep.pgErr
	}
	return err
}

// has reports whether r is on id, in any mode.
func (r *request) has(id keyID) bool {
	if r.m == nil {
		return idOf(r.key) == id
	}
	for _, k := range r.m.keys {
		if idOf(k) == id {
			return true
		}
	}
	return false
}
