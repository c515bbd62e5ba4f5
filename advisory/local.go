package advisory

import (
	"context"
	"slices"
	"time"

	"github.com/pglocks/pglocks"
)

// keyID identifies a server lock: KeyOf("x") and Int64Key of the same value
// are one lock, so local state is keyed by space and value, not by Key.
type keyID struct {
	space pglocks.Space
	v     int64
}

func idOf(k pglocks.Key) keyID { return keyID{k.Space(), k.Int64()} }

// keyState is the in-process state of one key, guarded by Locker.mu.
// PostgreSQL session locks are re-entrant per session, so two holders in
// this process could both "acquire" a key on one session: reservations
// exclude them here first, like a sync.RWMutex with a FIFO queue (a queued
// writer stops later readers, so writers do not starve).
type keyState struct {
	readers   int
	writer    bool
	queue     []*localWaiter
	wakers    []chan struct{} // server-level waiters, woken on unlock
	contended bool            // a remote waiter asked to be notified
	inflight  bool            // writer is a multi's reservation, not yet a Lock (see reserveFree)
	settle    []chan struct{} // multis waiting for inflight to end
}

type localWaiter struct {
	shared  bool
	granted bool
	ready   chan struct{}
}

func (ks *keyState) idle() bool {
	return ks.readers == 0 && !ks.writer && len(ks.queue) == 0 && len(ks.wakers) == 0 && len(ks.settle) == 0
}

// stateLocked returns the state of id, creating it. l.mu must be held.
func (l *Locker) stateLocked(id keyID) *keyState {
	ks := l.keys[id]
	if ks == nil {
		ks = &keyState{}
		l.keys[id] = ks
	}
	return ks
}

// gcLocked drops the state of id when nothing refers to it.
func (l *Locker) gcLocked(id keyID, ks *keyState) {
	if ks.idle() {
		delete(l.keys, id)
	}
}

// reserve takes the in-process reservation of id in the given mode. Without
// wait it fails with ErrLocked at once; with wait it queues until granted or
// ctx ends.
func (l *Locker) reserve(ctx context.Context, id keyID, shared, wait bool) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	ks := l.stateLocked(id)
	if len(ks.queue) == 0 && !ks.writer && (shared || ks.readers == 0) {
		if ks.readers == 0 {
			l.recallAskLocked(id, ks)
		}
		if shared {
			ks.readers++
		} else {
			ks.writer = true
		}
		l.mu.Unlock()
		return nil
	}
	if !wait {
		l.gcLocked(id, ks)
		l.mu.Unlock()
		return ErrLocked
	}
	w := &localWaiter{shared: shared, ready: make(chan struct{})}
	ks.queue = append(ks.queue, w)
	l.mu.Unlock()

	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	case <-l.closing:
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.granted {
		l.unreserveLocked(id, shared)
	} else {
		for i, q := range ks.queue {
			if q == w {
				ks.queue = append(ks.queue[:i], ks.queue[i+1:]...)
				break
			}
		}
		l.grantLocked(ks)
		l.gcLocked(id, ks)
	}
	if l.closed {
		return ErrClosed
	}
	return context.Cause(ctx)
}

// unreserveLocked gives back a reservation and grants queued waiters.
func (l *Locker) unreserveLocked(id keyID, shared bool) {
	ks := l.keys[id]
	if ks == nil {
		return
	}
	if shared {
		ks.readers--
	} else {
		ks.writer = false
	}
	l.grantLocked(ks)
	if ks.readers == 0 && !ks.writer {
		ks.contended = false
	}
	l.gcLocked(id, ks)
}

func (l *Locker) unreserve(id keyID, shared bool) {
	l.mu.Lock()
	l.unreserveLocked(id, shared)
	l.mu.Unlock()
}

// grantLocked grants the compatible head of the queue.
func (l *Locker) grantLocked(ks *keyState) {
	for len(ks.queue) > 0 && !ks.writer {
		w := ks.queue[0]
		if !w.shared && ks.readers > 0 {
			return
		}
		ks.queue = ks.queue[1:]
		if w.shared {
			ks.readers++
		} else {
			ks.writer = true
		}
		w.granted = true
		close(w.ready)
	}
}

// addWaker registers a channel that wakeLocked signals when one of ids
// may be free.
func (l *Locker) addWaker(ids ...keyID) chan struct{} {
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	for _, id := range ids {
		ks := l.stateLocked(id)
		ks.wakers = append(ks.wakers, ch)
	}
	l.mu.Unlock()
	return ch
}

func (l *Locker) removeWaker(ch chan struct{}, ids ...keyID) {
	l.dropChan(ch, ids, func(ks *keyState) *[]chan struct{} { return &ks.wakers })
}

// dropChan forgets ch in the list of each of ids that list picks (its
// wakers, or its settle list), and lets go of a key state left unused.
func (l *Locker) dropChan(ch chan struct{}, ids []keyID, list func(*keyState) *[]chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		ks := l.keys[id]
		if ks == nil {
			continue
		}
		chans := list(ks)
		if i := slices.Index(*chans, ch); i >= 0 {
			*chans = slices.Delete(*chans, i, i+1)
		}
		l.gcLocked(id, ks)
	}
}

// wakeLocked signals every server-level waiter of id.
func (l *Locker) wakeLocked(id keyID) {
	ks := l.keys[id]
	if ks == nil {
		return
	}
	for _, ch := range ks.wakers {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	ks.wakers = nil
	l.gcLocked(id, ks)
}

func (l *Locker) wake(id keyID) {
	l.mu.Lock()
	l.wakeLocked(id)
	l.mu.Unlock()
}

// wakeAll signals every server-level waiter, after a gap in notifications.
func (l *Locker) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range l.keys {
		l.wakeLocked(id)
	}
}

// markContended records that a waiter elsewhere wants id, so that its next
// unlock notifies. For a key this process does not hold, the ask is kept
// for askInterval: a waiter asks again only that often (see shouldAsk), so
// a Lock of ours that takes the key meanwhile — the previous holder sent
// no wake-up (plain SQL, a crash, a holder that had not heard the ask) —
// still knows that someone waits (see recallAskLocked).
func (l *Locker) markContended(id keyID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ks := l.keys[id]; ks != nil && (ks.writer || ks.readers > 0) {
		ks.contended = true
		return
	}
	now := time.Now()
	if len(l.asks) >= maxAsks && now.Sub(l.asksPruned) >= askInterval {
		l.asksPruned = now // at most one sweep per askInterval
		for k, at := range l.asks {
			if now.Sub(at) >= askInterval {
				delete(l.asks, k)
			}
		}
	}
	if len(l.asks) < maxAsks {
		l.asks[id] = now
	}
}

// maxAsks bounds the asks kept for keys not held here; beyond it, within
// one askInterval, asks are dropped (a dropped one costs latency only).
const maxAsks = 4096

// recallAskLocked marks ks contended if a waiter elsewhere asked for id
// within askInterval. Called as this process starts to hold id.
func (l *Locker) recallAskLocked(id keyID, ks *keyState) {
	if at, ok := l.asks[id]; ok {
		if time.Since(at) < askInterval {
			ks.contended = true
		} else {
			delete(l.asks, id)
		}
	}
}

// isContended reports whether a waiter elsewhere asked to be notified when
// key is unlocked.
func (l *Locker) isContended(key pglocks.Key) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	ks := l.keys[idOf(key)]
	return ks != nil && ks.contended
}
