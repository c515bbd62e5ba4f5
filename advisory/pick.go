package advisory

import (
	"context"
	"fmt"
	"time"
)

// pickSession returns the live session with the fewest requests in flight,
// and of those the one holding the fewest locks: every statement on a
// session costs the server time in proportion to the locks the session
// holds (each transaction end scans the session's local lock table), so
// many locks are spread over the sessions. It opens another session (in
// the background, up to MaxSessions) when every session is busy or holds
// spreadAt locks, and waits for one when none is open yet.
func (l *Locker) pickSession(ctx context.Context) (*session, error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, ErrClosed
		}
		var best *session
		for _, s := range l.sessions {
			if best == nil || s.pending.Load() < best.pending.Load() ||
				s.pending.Load() == best.pending.Load() && len(s.locks) < len(best.locks) {
				best = s
			}
		}
		if (best == nil || best.pending.Load() > 0 || len(best.locks) >= spreadAt) &&
			len(l.sessions)+l.dialing < l.cfg.MaxSessions {
			l.dialing++
			l.wg.Add(1)
			go l.openSession()
		}
		if best != nil {
			l.mu.Unlock()
			return best, nil
		}
		if l.dialing == 0 && l.dialErr != nil {
			err := l.dialErr
			l.dialErr = nil
			l.mu.Unlock()
			return nil, err
		}
		changed := l.changed
		l.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// spreadAt is how many locks a session holds before another is opened.
const spreadAt = 64

// openSession dials a session and adds it to l.sessions.
func (l *Locker) openSession() {
	defer l.wg.Done()
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.QueryTimeout+l.connectTimeout())
	defer cancel()
	conn, err := l.connect(ctx, nil)
	if err == nil {
		if err = prepareAll(ctx, conn); err != nil {
			_ = conn.Close(ctx)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dialing--
	close(l.changed)
	l.changed = make(chan struct{})
	if err != nil {
		l.dialErr = fmt.Errorf("open session: %w", err)
		return
	}
	if l.closed {
		_ = conn.Close(ctx)
		return
	}
	s := &session{
		l:       l,
		conn:    conn,
		pid:     conn.PID(),
		signal:  make(chan struct{}, 1),
		dead:    make(chan struct{}),
		lastUse: time.Now(),
		locks:   map[*Lock]struct{}{},
	}
	l.dialErr = nil
	l.sessions = append(l.sessions, s)
	l.ownPIDs[s.pid] = true
	l.wg.Add(1)
	go s.run()
}

// connectTimeout is the pool's connect_timeout, else 10s.
func (l *Locker) connectTimeout() time.Duration {
	if l.connCfg.ConnectTimeout > 0 {
		return l.connCfg.ConnectTimeout
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
