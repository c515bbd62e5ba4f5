package advisory

import "sync"

// events relays the Locker's events to its Logger and Observer, user code
// that may be slow or block. Events are queued wherever they happen — often
// with l.mu and a session's mu held — and delivered in order, later, by a
// goroutine that holds none of the Locker's locks: the caller whose call
// produced them (after its statement, so that TryLock's Start and Unlock's
// End usually reach the Observer before the call returns), or, for events
// of a session's worker (pings, the queued path, Close), a goroutine of
// their own, joined by Close. A callback that blocks therefore delays
// other events only: it never holds a session's mu, so the worker goes on
// pinging the session's locks and the server never finds a healthy
// session idle (TestBlockedCallbackKeepsLocks).
type events struct {
	mu         sync.Mutex
	q          []func()
	delivering bool // a goroutine is running the queue
}

// post queues the delivery of one event. It calls no user code, so any
// lock may be held.
func (l *Locker) post(f func()) {
	l.ev.mu.Lock()
	l.ev.q = append(l.ev.q, f)
	l.ev.mu.Unlock()
}

// deliver runs the queued events on the calling goroutine, unless another
// goroutine is already running them (that one runs these too). None of
// the Locker's locks may be held, and it must not be a session's worker.
func (l *Locker) deliver() {
	if l.ev.claim() {
		l.ev.run()
	}
}

// deliverAsync has the queued events run by a goroutine of their own, for
// a session's worker, which must never wait for user code. The caller
// must be one of l's goroutines (counted in l.wg), so that the count is
// not zero.
func (l *Locker) deliverAsync() {
	if !l.ev.claim() {
		return
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.ev.run()
	}()
}

// claim makes the caller the one that runs the queue; false if the queue
// is empty or another goroutine runs it.
func (e *events) claim() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.delivering || len(e.q) == 0 {
		return false
	}
	e.delivering = true
	return true
}

// run delivers queued events in order until the queue is empty. Should a
// callback panic, the next claim takes over the rest.
func (e *events) run() {
	done := false
	defer func() {
		if !done { // a callback panicked
			e.mu.Lock()
			e.delivering = false
			e.mu.Unlock()
		}
	}()
	for {
		e.mu.Lock()
		if len(e.q) == 0 {
			e.delivering, done = false, true
			e.mu.Unlock()
			return
		}
		f := e.q[0]
		e.q[0] = nil
		e.q = e.q[1:]
		e.mu.Unlock()
		f()
	}
}
