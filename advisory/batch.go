package advisory

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The worker pipelines its queue: it takes up to maxBatch queued requests,
// writes all their statements at once (each its own Bind, Execute and
// Sync, so each runs in its own implicit transaction and an error in one
// does not touch the others) with a single Flush, then reads every reply
// in order, and only then completes the requests one by one as do would.
//
// Completion waits until every reply is read because completing may use
// the connection itself (settle reads pg_locks, a try whose caller left is
// undone at once), which cannot happen while replies are still in flight.
// The requests of a batch have distinct keys, so completing them after the
// whole batch ran is the same as completing each right after its own
// statement: no statement in the batch touches another's key, on the
// server (what settle reads from pg_locks) or locally (what unlockStmt
// reads to choose the unlock statement at send time).
//
// A transport error on any reply leaves the session dead, as in do: it
// dies at once, before any request completes, so every lock the session
// took is announced lost while the server frees them when the backend
// ends; then every request of the batch gets the dead-session handling
// (see failDead), those whose reply was read before the error too — a try
// granted there cannot be recorded on a dead session, and its lock goes
// with the backend. A session that dies while an earlier request of the
// batch completes (a settle or undo that fails) fails the rest the same
// way.

// maxBatch is the most requests the worker pipelines in one batch.
const maxBatch = 32

// popBatch takes up to maxBatch queued requests for one batch, stopping
// before a request whose key is already in it.
func (s *session) popBatch(batch []*request) []*request {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	n := 0
	for n < len(s.q) && len(batch) < maxBatch && !hasKey(batch, s.q[n]) {
		batch = append(batch, s.q[n])
		s.q[n] = nil
		n++
	}
	s.q = s.q[n:]
	return batch
}

// hasKey reports whether a request in batch is on one of r's keys, in any
// mode.
func hasKey(batch []*request, r *request) bool {
	for _, b := range batch {
		if r.m == nil {
			if b.has(idOf(r.key)) {
				return true
			}
			continue
		}
		for _, k := range r.m.keys {
			if b.has(idOf(k)) {
				return true
			}
		}
	}
	return false
}

// runBatch runs the requests of batch pipelined; a non-nil error means the
// session died.
func (s *session) runBatch(batch []*request) error {
	s.lastUse = time.Now()
	live := batch[:0]
	for _, r := range batch {
		if !s.skip(r) {
			live = append(live, r)
		}
	}
	if len(live) == 0 {
		return nil
	}
	reps := make([]reply, len(live))
	read, err := s.pipeline(live, reps)
	if err != nil {
		// The session is dead before anything completes: replies may
		// still be in flight (a timeout leaves pgconn open), so no
		// completion may use the connection, and no try answered before
		// the error may hand out a Lock on a closed session.
		s.die(fmt.Errorf("pipelined batch of %d: %w", len(live), err))
	}
	var dead error
	for i, r := range live {
		var rerr error
		switch {
		case i >= read:
			rerr = err // the reply was not read: the session is dead
		case s.isDead():
			rerr = errDiedInBatch
		}
		if cerr := s.complete(r, &reps[i], rerr); cerr != nil {
			dead = cerr
		}
	}
	if dead == nil && s.isDead() {
		dead = errAlreadyDead
	}
	return dead
}

// errDiedInBatch is the cause given to a request whose reply was read but
// whose session died while an earlier request of its batch completed.
var errDiedInBatch = errors.New("the session died earlier in the batch")

// skip finishes r without a statement when r is a try whose
// caller left or whose Locker is closing; it reports whether it did.
func (s *session) skip(r *request) bool {
	if r.kind == opUnlock {
		return false
	}
	switch {
	case r.state.Load() == reqAbandoned:
	case s.l.isClosed():
		r.err = ErrClosed
	default:
		return false
	}
	s.pending.Add(-1)
	s.finishOrUndo(r)
	return true
}

// pipeline sends the statements of rs back to back with one Flush and
// reads their replies into reps, in order. It returns how many replies
// were read in full, and the transport error that stopped it, if any. The
// send time noted for every reply is the one before the first statement
// was written: each reply proves the session alive at least then.
func (s *session) pipeline(rs []*request, reps []reply) (int, error) {
	s.arm()
	for _, r := range rs {
		s.write(s.requestArgs(r))
	}
	if err := s.conn.Frontend().Flush(); err != nil {
		return 0, fmt.Errorf("send a batch of %d: %w", len(rs), err)
	}
	for i := range rs {
		if i > 0 {
			s.extend(time.Now()) // each statement gets QueryTimeout/2 at least
		}
		if err := s.recv(context.Background(), &reps[i]); err != nil {
			return i, err
		}
	}
	return len(rs), nil
}
