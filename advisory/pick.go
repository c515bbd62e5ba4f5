package advisory

import (
	"context"
	"time"

	"github.com/pglocks/pglocks/internal/backoff"
)

// dialState paces the Locker's dials (sessions and listener alike) while
// they fail: after a failed dial at most one dial is under way, shared by
// every call that waits for a session. A call that finds no session open
// and was made at least redialAfter after the last failed dial ended
// starts the next one at once (see pickSession); any other dial — for a
// call made sooner, for a call that already saw a dial fail, to spread
// the load over more sessions, or for the listener — starts no earlier
// than next, a capped exponential backoff with jitter (internal/backoff:
// 25–50 ms after the first failure, doubling to 0.5–1 s). So calls make
// at most one dial per redialAfter plus the dial's own time during an
// outage (about 40/s against a refused port), and waiting calls alone at most 2 dials per second
// at steady state, however many calls there are. A successful dial ends
// it. Guarded by Locker.mu.
type dialState struct {
	failed   error     // the latest dial's error; nil after a success
	failedAt time.Time // when the dial that failed started
	endedAt  time.Time // when the dial that failed ended
	gen      uint64    // failed dials so far
	next     time.Time // while failed: no retrying dial before this
	listener bool      // the listener is dialing
	bo       backoff.Backoff
}

// redialAfter is how long the error of a failed dial answers the calls
// that find no session open before one of them dials again: the shortest
// backoff of dialState. A try made sooner returns that error, marked as
// the error of a dial that ended before the call.
const redialAfter = backoff.DefaultMin / 2

// call is what pickSession knows of the call it picks a session for: when
// it began, and how many dials had failed by then.
type call struct {
	at  time.Time
	gen uint64
}

// beginCall returns the call that begins now.
func (l *Locker) beginCall() call {
	l.mu.Lock()
	defer l.mu.Unlock()
	return call{at: time.Now(), gen: l.dial.gen}
}

// mayDialLocked reports whether a session dial may start now for c: while
// dials fail, only when none is under way, and only once the backoff has
// passed — unless no session is open (c would otherwise get an error) and
// the latest failure ended at least redialAfter before c began. A dial that only spreads the load over more sessions always
// waits for the backoff: a role at its connection limit would otherwise
// see a dial (a backend forked and rejected) on almost every call.
func (l *Locker) mayDialLocked(now time.Time, c call) bool {
	if len(l.sessions)+l.dialing >= l.cfg.MaxSessions {
		return false
	}
	if l.dial.failed == nil {
		return true
	}
	if l.dialing > 0 || l.dial.listener {
		return false
	}
	fresh := l.dial.gen == c.gen && c.at.Sub(l.dial.endedAt) >= redialAfter
	return len(l.sessions) == 0 && fresh || !now.Before(l.dial.next)
}

// dialEndedLocked records the result of a dial that started at start and
// wakes whoever waits for one.
func (l *Locker) dialEndedLocked(err error, start time.Time) {
	if err != nil {
		now := time.Now()
		l.dial.failed, l.dial.failedAt, l.dial.endedAt = err, start, now
		l.dial.gen++
		l.dial.next = now.Add(l.dial.bo.Next())
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
// When none is open and none can be opened, it returns a dialError. The
// rule (see the package doc, When the database is unavailable): a call c
// made at least redialAfter after the last failed dial ended dials at
// once; one made sooner gets that dial's error, which then says that the
// dial ended before the call; and a dial under way is shared by every
// call that comes meanwhile, whose error then says that the dial started
// before the call. A try (wait false) returns the error
// of the dial it made or shared; a waiting call only a failure of a dial
// that ended after this pick began, so that a retrying Lock waits for the
// next dial, which dialState paces.
func (l *Locker) pickSession(ctx context.Context, wait bool, c call) (*session, error) {
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
		if (best == nil || best.pending.Load() > 0 || len(best.locks) >= spreadAt) && l.mayDialLocked(time.Now(), c) {
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
			de := dialError{err: err, started: l.dial.failedAt, ended: l.dial.endedAt, call: c.at}
			l.mu.Unlock()
			return nil, de
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
	start := time.Now()
	conn, pid, err := l.connect(ctx, nil, l.cfg.TCPUserTimeout)
	if err == nil {
		if err = prepareAll(ctx, conn); err != nil {
			_ = conn.Close(ctx)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dialing--
	l.dialEndedLocked(err, start)
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
