package advisory

import (
	"context"
	"time"

	"github.com/pglocks/pglocks/internal/backoff"
)

// dialState paces the Locker's dials (sessions and listener alike) while
// they fail: after a failed dial at most one dial is under way, and the
// next one starts no earlier than next, a capped exponential backoff with
// jitter (internal/backoff: 25–50 ms after the first failure, doubling to
// 0.5–1 s), so a Locker makes at most 2 dials per second at steady state
// during an outage, however many calls wait. A successful dial ends it.
// Guarded by Locker.mu.
type dialState struct {
	failed   error     // the latest dial's error; nil after a success
	gen      uint64    // failed dials so far
	next     time.Time // while failed: no dial before this
	listener bool      // the listener is dialing
	bo       backoff.Backoff
}

// mayDialLocked reports whether a session dial may start now.
func (l *Locker) mayDialLocked(now time.Time) bool {
	if len(l.sessions)+l.dialing >= l.cfg.MaxSessions {
		return false
	}
	return l.dial.failed == nil || l.dialing == 0 && !l.dial.listener && !now.Before(l.dial.next)
}

// dialEndedLocked records a dial's result and wakes whoever waits for one.
func (l *Locker) dialEndedLocked(err error) {
	if err != nil {
		l.dial.failed = err
		l.dial.gen++
		l.dial.next = time.Now().Add(l.dial.bo.Next())
	} else if l.dial.failed != nil {
		l.dial.failed = nil
		l.dial.bo.Reset()
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

// pickSession returns the live session with the fewest requests in flight,
// and of those the one holding the fewest locks: every statement on a
// session costs the server time in proportion to the locks the session
// holds (each transaction end scans the session's local lock table), so
// many locks are spread over the sessions. It opens another session (in
// the background, up to MaxSessions) when every session is busy or holds
// spreadAt locks, and waits for one when none is open yet.
//
// When none is open and none can be opened, it returns a dialError: for a
// try (wait false) the latest failure if no dial is under way, else the
// failure of the dial it waited for; for a waiting call, only a failure of
// a dial that ended after it was called, so that a retrying Lock waits for
// the next dial, which dialState paces.
func (l *Locker) pickSession(ctx context.Context, wait bool) (*session, error) {
	l.mu.Lock()
	gen := l.dial.gen
	l.mu.Unlock()
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, ErrClosed
		}
		best := l.leastBusyLocked()
		if (best == nil || best.pending.Load() > 0 || len(best.locks) >= spreadAt) && l.mayDialLocked(time.Now()) {
			l.dialing++
			l.wg.Add(1)
			go l.openSession()
		}
		if best != nil {
			l.mu.Unlock()
			return best, nil
		}
		idle := l.dialing == 0 && !l.dial.listener
		if err := l.dial.failed; err != nil && (l.dial.gen != gen || !wait && idle) {
			l.mu.Unlock()
			return nil, dialError{err}
		}
		changed, next := l.changed, l.dial.next
		l.mu.Unlock()
		if err := l.awaitChange(ctx, changed, idle, next); err != nil {
			return nil, err
		}
	}
}

// awaitChange waits until changed is closed, ctx ends (its cause is
// returned) or l closes, and, if timed, until the instant next.
func (l *Locker) awaitChange(ctx context.Context, changed chan struct{}, timed bool, next time.Time) error {
	var at <-chan time.Time
	if timed {
		t := time.NewTimer(time.Until(next))
		defer t.Stop()
		at = t.C
	}
	select {
	case <-changed:
	case <-at:
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-l.closing:
	}
	return nil
}

// leastBusyLocked returns the session pickSession prefers, or nil.
func (l *Locker) leastBusyLocked() *session {
	var best *session
	for _, s := range l.sessions {
		if best == nil || s.pending.Load() < best.pending.Load() ||
			s.pending.Load() == best.pending.Load() && len(s.locks) < len(best.locks) {
			best = s
		}
	}
	return best
}

// spreadAt is how many locks a session holds before another is opened.
const spreadAt = 64

// openSession dials a session and adds it to l.sessions.
func (l *Locker) openSession() {
	defer l.wg.Done()
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.QueryTimeout+l.connectTimeout())
	defer cancel()
	conn, pid, err := l.connect(ctx, nil, l.cfg.TCPUserTimeout)
	if err == nil {
		if err = prepareAll(ctx, conn); err != nil {
			_ = conn.Close(ctx)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dialing--
	l.dialEndedLocked(err)
	if err != nil {
		return
	}
	if l.closed {
		_ = conn.Close(ctx)
		return
	}
	if !l.listens {
		l.listens = true
		l.wg.Add(1)
		go l.listen()
	}
	s := &session{
		l:       l,
		conn:    conn,
		pid:     pid,
		signal:  make(chan struct{}, 1),
		dead:    make(chan struct{}),
		lastUse: time.Now(),
		locks:   map[*Lock]struct{}{},
	}
	l.sessions = append(l.sessions, s)
	l.ownPIDs[s.pid] = true
	l.wg.Add(1)
	go s.run()
}

// connectTimeout is the pool's connect_timeout, else 10s.
func (l *Locker) connectTimeout() time.Duration {
	if d := l.poolCfg.ConnConfig.ConnectTimeout; d > 0 {
		return d
	}
	return 10 * time.Second
}

// removeSessionLocked forgets a session that died or closed.
func (l *Locker) removeSessionLocked(s *session) {
	for i, x := range l.sessions {
		if x == s {
			l.sessions = append(l.sessions[:i], l.sessions[i+1:]...)
			break
		}
	}
	delete(l.ownPIDs, s.pid)
	close(l.changed)
	l.changed = make(chan struct{})
}
