package advisory

import (
	"context"
	"sync/atomic"

	"github.com/pglocks/pglocks"
)

// opKind is what a request does on its session.
type opKind uint8

const (
	opTry opKind = iota
	opUnlock
	opTryAll // a multi: several keys in one statement, all-or-none
)

// The states of a request: the session finishes it (done) or its caller
// gives up on it (abandoned), whichever comes first.
const (
	reqPending int32 = iota
	reqDone
	reqAbandoned
)

// request is one statement for a session, a try or an unlock, with its
// result.
type request struct {
	kind   opKind
	key    pglocks.Key
	shared bool
	want   bool   // on a failed try, notify holders that someone waits
	lock   *Lock  // opUnlock
	m      *multi // opTryAll: key is m.label
	state  atomic.Int32
	done   chan struct{}

	got   *Lock   // opTry: the lock, nil when busy
	taken []*Lock // opTryAll: the locks, nil when busy
	err   error
}

func newRequest(kind opKind, key pglocks.Key, shared bool) *request {
	return &request{kind: kind, key: key, shared: shared, done: make(chan struct{})}
}

// errAbandoned wraps the ctx error of a request the caller gave up on.
type errAbandoned struct{ err error }

func (e errAbandoned) Error() string { return e.err.Error() }
func (e errAbandoned) Unwrap() error { return e.err }

// submit queues r and waits for its result or for ctx. It returns
// errAbandoned when the caller gave up on a queued or running request,
// which the worker then completes (an unlock) or undoes (a try).
func (s *session) submit(ctx context.Context, r *request) error {
	s.qmu.Lock()
	if s.stopped {
		s.qmu.Unlock()
		return s.stopErr
	}
	s.q = append(s.q, r)
	s.pending.Add(1)
	s.qmu.Unlock()
	select {
	case s.signal <- struct{}{}:
	default:
	}
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
	}
	if r.state.CompareAndSwap(reqPending, reqAbandoned) {
		return errAbandoned{context.Cause(ctx)}
	}
	<-r.done
	return nil
}

// finish hands r's result to its caller; false if the caller gave up.
func (r *request) finish() bool {
	if r.state.CompareAndSwap(reqPending, reqDone) {
		close(r.done)
		return true
	}
	return false
}
