package advisory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pglocks/pglocks/internal/lockstmt"
)

// session is one dedicated server connection that holds session locks.
// Statements on it never interleave: whoever runs one holds mu, either a
// caller (the direct path, when the session is idle) or the session's
// worker goroutine, which runs queued requests in order — pipelined, up to
// maxBatch at a time (see runBatch) — and pings an idle session that holds
// locks. A caller whose ctx ends never breaks the
// connection: the statement's answer is still read, and an unwanted
// acquisition undone.
//
// A try request carries its key's in-process reservation. The caller keeps
// it unless it abandons the request (its ctx ended while the request was
// queued or running); then the worker gives it back, or the lock taken
// despite the caller leaving gives it back when the worker unlocks it.
type session struct {
	l       *Locker
	conn    *pgconn.PgConn
	pid     uint32
	signal  chan struct{} // cap 1: the queue is not empty
	pending atomic.Int32  // requests queued or running, for balancing

	qmu     sync.Mutex
	q       []*request
	stopped bool
	stopErr error // why the session stopped, set with stopped

	mu       sync.Mutex         // held by whoever uses conn: worker or direct caller
	dead     chan struct{}      // closed by die or shutdown, with mu held
	lastUse  time.Time          // guarded by mu
	deadline time.Time          // guarded by mu: the socket's deadline
	sentAt   time.Duration      // guarded by mu: send time of the statement in flight, since monoBase
	verified atomic.Int64       // send time of the latest answered statement, since monoBase
	locks    map[*Lock]struct{} // guarded by l.mu
	nlocks   atomic.Int32       // len(locks), for the worker's ping decision without l.mu
}

// stop refuses new requests and returns the queued ones.
func (s *session) stop(err error) []*request {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	s.stopped, s.stopErr = true, err
	rest := s.q
	s.q = nil
	return rest
}

// fail finishes requests that will not run: tries with err, unlocks with
// ErrNotHeld and why their lock ended.
func (s *session) fail(rs []*request, err error) {
	for _, r := range rs {
		s.pending.Add(-1)
		r.err = err
		if r.kind == opUnlock {
			r.err = fmt.Errorf("%w: %w", ErrNotHeld, r.lock.Err())
		}
		s.finishOrUndo(r)
	}
}

// finishOrUndo hands a try that did not take the lock back to its caller,
// or gives back the reservation of a caller that left.
func (s *session) finishOrUndo(r *request) {
	if r.finish() {
		return
	}
	switch r.kind {
	case opTry:
		s.l.unreserve(idOf(r.key), r.shared)
	case opTryAll:
		s.l.unreserveKeys(r.m.keys)
	}
}

// runDirect runs r on the caller's goroutine when the session is idle,
// which saves two goroutine hand-offs per statement. It reports false, and
// does nothing, when the session is busy or has requests queued (those go
// first). If ctx ends while the statement runs, runDirect returns at once
// with errAbandoned, and a goroutine reads the answer and completes r (an
// unlock) or undoes it (a try) before it lets the session go.
func (s *session) runDirect(ctx context.Context, r *request) (bool, error) {
	if !s.mu.TryLock() {
		return false, nil
	}
	s.qmu.Lock()
	if s.stopped || len(s.q) > 0 {
		s.qmu.Unlock()
		s.mu.Unlock()
		return false, nil
	}
	s.pending.Add(1)
	s.qmu.Unlock()
	handedOff, err := s.do(ctx, r)
	if handedOff {
		return true, errAbandoned{context.Cause(ctx)}
	}
	if err != nil {
		s.die(err)
	}
	s.mu.Unlock()
	s.l.deliver()
	return true, nil
}

// run is the worker: it runs queued requests, pings when idle (see
// pingDue), and on Close releases everything and closes the connection.
// Its ticker runs at Config.pingEvery()/2, so that an idle session holding
// locks sends a ping at most pingEvery (PingInterval, or TCPUserTimeout/2
// if shorter; plus a round trip) after its last statement or ping. It
// never runs user code: the events it produces are
// delivered by a goroutine of their own (see [events]), so a callback that
// blocks cannot stop the pings.
func (s *session) run() {
	defer s.l.wg.Done()
	defer s.l.deliverAsync()
	tick := time.NewTicker(s.l.cfg.pingEvery() / 2)
	defer tick.Stop()
	for {
		var alive bool
		select {
		case <-s.signal:
			alive = s.drain()
		case <-tick.C:
			alive = s.tick()
		case <-s.dead:
			return
		case <-s.l.closing:
			s.mu.Lock()
			if !s.isDead() {
				s.shutdown()
			}
			s.mu.Unlock()
			return
		}
		if !alive {
			return
		}
		s.l.deliverAsync()
	}
}

// tick pings the session if it is idle and due a ping; false when the
// session is dead.
func (s *session) tick() bool {
	if !s.mu.TryLock() {
		return true // in use, so not idle
	}
	defer s.mu.Unlock()
	if s.isDead() {
		return false
	}
	if !s.pingDue() {
		return true
	}
	err := s.ping()
	s.lastUse = time.Now()
	if err != nil {
		s.die(fmt.Errorf("ping: %w", err))
		return false
	}
	return true
}

// drain runs the queued requests, several at a time pipelined (see
// runBatch); false when the session died.
func (s *session) drain() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	var buf [maxBatch]*request
	for !s.isDead() {
		batch := s.popBatch(buf[:0])
		var err error
		switch len(batch) {
		case 0:
			return true
		case 1:
			_, err = s.do(context.Background(), batch[0])
		default:
			err = s.runBatch(batch)
		}
		clear(batch)
		if err != nil {
			s.die(err)
			return false
		}
	}
	return false
}

func (s *session) isDead() bool {
	select {
	case <-s.dead:
		return true
	default:
		return false
	}
}

// pingDue reports whether the idle session is due a ping. The worker looks
// every pingEvery/2, so a ping goes out at most pingEvery/2 after it is
// due: one that holds locks is due pingEvery/2 after its last use, so that
// its death is noticed within pingEvery + QueryTimeout; one that holds
// none TCPUserTimeout/2 − pingEvery/2 after, only so that the server's
// idle_session_timeout (TCPUserTimeout, see [Locker.sessionSettings]) does
// not end it. Either way the server hears from a healthy session at least
// every TCPUserTimeout/2 (plus a round trip): half its idle bound is left
// for a stall of the client. s.mu must be held.
func (s *session) pingDue() bool {
	half := s.l.cfg.pingEvery() / 2
	due := s.l.cfg.TCPUserTimeout/2 - half
	if s.holding() {
		due = half
	}
	return time.Since(s.lastUse) >= due
}

// holding reports whether the session holds locks. It takes no lock.
func (s *session) holding() bool { return s.nlocks.Load() > 0 }

// die closes the connection and announces the loss of every lock on it.
// s.mu must be held.
func (s *session) die(cause error) {
	if errors.Is(cause, errAlreadyDead) || s.isDead() {
		return
	}
	close(s.dead)
	ctx, cancel := context.WithTimeout(context.Background(), s.l.cfg.QueryTimeout)
	_ = s.conn.Close(ctx)
	cancel()
	s.l.mu.Lock()
	s.l.removeSessionLocked(s)
	lost := fmt.Errorf("%w: session (pid %d) died: %w", ErrLost, s.pid, cause)
	for lk := range s.locks {
		lk.endLocked(lockLost, lost)
	}
	s.locks = nil
	s.nlocks.Store(0)
	s.l.mu.Unlock()
	err := fmt.Errorf("%w (pid %d): %w", errSessionDied, s.pid, cause)
	s.fail(s.stop(err), err)
}

// shutdown releases every lock of the session and closes it (Close).
// s.mu must be held.
func (s *session) shutdown() {
	close(s.dead)
	ctx, cancel := context.WithTimeout(context.Background(), s.l.cfg.QueryTimeout)
	defer cancel()
	s.arm()
	rest := s.stop(ErrClosed)
	_, err := s.conn.Exec(ctx, lockstmt.UnlockAll).ReadAll()
	_ = s.conn.Close(ctx)
	s.l.mu.Lock()
	s.l.removeSessionLocked(s)
	if err == nil {
		// Unlocks still queued are done: unlock_all released their locks.
		for _, r := range rest {
			if r.kind == opUnlock {
				delete(s.locks, r.lock)
				r.lock.endLocked(lockUnlocked, nil)
			}
		}
	}
	for lk := range s.locks {
		if err != nil {
			lk.endLocked(lockLost, fmt.Errorf("%w: Close could not release it: %w", ErrLost, err))
		} else {
			lk.endLocked(lockClosed, ErrClosed)
		}
	}
	s.locks = nil
	s.nlocks.Store(0)
	s.l.mu.Unlock()
	for _, r := range rest {
		if r.kind == opUnlock && err == nil {
			s.pending.Add(-1)
			r.finish()
			continue
		}
		s.fail([]*request{r}, ErrClosed)
	}
	if err != nil {
		s.l.addCloseErr(fmt.Errorf("advisory: close: release locks of session pid %d: %w", s.pid, err))
	}
}
