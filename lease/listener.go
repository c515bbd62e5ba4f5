package lease

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pglocks/pglocks"
)

// listener holds one connection per store that LISTENs on the store's
// channel. It wakes the waiting Acquire calls of a name whose release a
// NOTIFY announces, and ends at once the store's leases whose loss one
// announces (Break, takeover after expiry). It starts with the first
// Acquire that has to wait or the first lease the store holds.
//
// NOTIFY is not free: a notifying commit takes a cluster-wide lock, which
// costs release throughput when many clients commit at once. So releases
// notify only when someone waits. The listener's session holds a shared
// advisory lock on [interestKey] for every name that has waiters; a release
// tries to take the same key exclusively, transaction-scoped, and notifies
// only when it cannot. A waiter takes its interest before its next try, and
// a release that found no interest holds the key until it commits, so that
// a waiter arriving meanwhile blocks on the key and then sees the release
// in its try: no wake-up is lost.
type listener struct {
	s *Store

	mu      sync.Mutex
	waiters map[string]map[*waiter]struct{}
	held    map[string]bool      // names whose interest the session holds
	idle    map[string]time.Time // held names without waiters, since when
	dirty   bool                 // a reconcile is needed
	kick    context.CancelFunc   // interrupts the current wait, if any
	on      bool                 // the session listens (for tests)
	polling bool                 // behind transaction pooling: no LISTEN, waiters poll
}

// interestLinger is how long the interest in a name outlives its last
// waiter, so that a hot name's waiters, coming and going, do not cost a
// lock and an unlock each.
const interestLinger = time.Second

// waiter is one Acquire call waiting for a name.
type waiter struct {
	wake  chan struct{} // a release of the name (or a reconnect) was heard
	ready chan struct{} // closed once its interest is settled
	once  sync.Once
}

func (w *waiter) settle() { w.once.Do(func() { close(w.ready) }) }

// interestKey is the advisory key of the interest in name: in the bigint
// space, hashtextextended('pglocks.lease:' || channel || ':' || name, 0).
func interestKey(channel, name string) int64 {
	return pglocks.KeyOf("pglocks.lease:" + channel + ":" + name).Int64()
}

// listener returns the store's listener, starting it on first use.
func (s *Store) listener() (*listener, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if s.lis == nil {
		s.lis = &listener{s: s, waiters: make(map[string]map[*waiter]struct{}),
			held: make(map[string]bool), idle: make(map[string]time.Time)}
		s.wg.Add(1)
		go s.lis.run(s.ctx)
	}
	return s.lis, nil
}

// register adds a waiter for name; wait for w.ready (see awaitReady)
// before trying, so that a release from then on notifies.
func (lis *listener) register(name string) *waiter {
	return lis.add(name, &waiter{wake: make(chan struct{}, 1), ready: make(chan struct{})})
}

// add registers w as a waiter for name and returns it (see register).
func (lis *listener) add(name string, w *waiter) *waiter {
	lis.mu.Lock()
	defer lis.mu.Unlock()
	set := lis.waiters[name]
	if set == nil {
		set = make(map[*waiter]struct{})
		lis.waiters[name] = set
	}
	set[w] = struct{}{}
	delete(lis.idle, name)
	if lis.held[name] || lis.polling {
		w.settle() // a release from now on notifies
	} else {
		lis.markDirty()
	}
	return w
}

func (lis *listener) unregister(name string, w *waiter) {
	lis.mu.Lock()
	defer lis.mu.Unlock()
	delete(lis.waiters[name], w)
	if len(lis.waiters[name]) == 0 {
		delete(lis.waiters, name)
		if lis.held[name] {
			lis.idle[name] = time.Now()
		}
	}
}

// markDirty asks the listener goroutine to reconcile. lis.mu held.
func (lis *listener) markDirty() {
	lis.dirty = true
	if lis.kick != nil {
		lis.kick()
	}
}

// awaitReady waits until w's interest is held, or the listener failed to
// take it, or a short while when the listener is not connected: in that
// case the waiter relies on the holder's expiry and the wake-up that
// follows a reconnect.
func (lis *listener) awaitReady(ctx context.Context, w *waiter) {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-w.ready:
	case <-t.C:
	case <-ctx.Done():
	case <-lis.s.ctx.Done():
	}
}

// hear starts the listener, if it is not running, so that the store hears
// of the loss of its leases. Errors are ignored: without the listener a
// loss is noticed by the keep-alive's check or the trust deadline.
func (s *Store) hear() { _, _ = s.listener() }

// notified handles one notification's payload (see queries): "r" + name,
// a release; "l" + token + ":" + name, the end of every acquisition of
// name with a token up to token. Other payloads are ignored.
func (lis *listener) notified(payload string) {
	switch {
	case strings.HasPrefix(payload, "r"):
		lis.wake(payload[1:])
	case strings.HasPrefix(payload, "l"):
		tok, name, ok := strings.Cut(payload[1:], ":")
		token, err := strconv.ParseInt(tok, 10, 64)
		if ok && err == nil {
			lis.s.lostUpTo(name, token)
		}
	}
}

// lostUpTo ends every live lease of name with a token up to token: the
// server announced that another acquisition, or a Break, superseded them.
func (s *Store) lostUpTo(name string, token int64) {
	var over []*Lease
	s.mu.Lock()
	for _, l := range s.leases {
		if l.name == name && l.token <= token {
			over = append(over, l)
		}
	}
	s.mu.Unlock()
	for _, l := range over {
		l.lose("broken or taken over (announced)")
	}
}

// wake wakes every waiter of name.
func (lis *listener) wake(name string) {
	lis.mu.Lock()
	defer lis.mu.Unlock()
	for w := range lis.waiters[name] {
		poke(w.wake)
	}
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// run keeps a listening connection open until ctx ends, reconnecting with
// backoff. Waiters do not depend on it for safety: without notifications
// they wake at the holder's expiry.
func (lis *listener) run(ctx context.Context) {
	defer lis.s.wg.Done()
	const maxBackoff = 2 * time.Second
	backoff := 10 * time.Millisecond
	for {
		if lis.session(ctx) {
			backoff = 10 * time.Millisecond
		}
		if ctx.Err() != nil || lis.polls() {
			return
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}
