package lease

import (
	"context"
	"sync"
)

// turns queues the Acquire calls of one name within one store, first come
// first served: only the head of a name's queue tries the server and waits
// for its release, so a release wakes one waiter of the store, not all of
// them, and a hot name costs a hand-off a few statements whatever the
// number of waiters. Across stores (and processes) the NOTIFY wake-up and
// the race for the row stay as they were; a TryAcquire does not queue.
type turns struct {
	mu sync.Mutex
	q  map[string][]*turn
}

// turn is one queued Acquire call; ready is closed when it heads the queue.
type turn struct{ ready chan struct{} }

// queue appends a turn for name; the caller must call leave with it.
func (s *Store) queue(name string) *turn {
	t := &turn{ready: make(chan struct{})}
	s.turns.mu.Lock()
	defer s.turns.mu.Unlock()
	q := s.turns.q[name]
	if len(q) == 0 {
		close(t.ready)
	}
	s.turns.q[name] = append(q, t)
	return t
}

// leave removes t from name's queue, handing the head to the next turn
// when t had it.
func (s *Store) leave(name string, t *turn) {
	s.turns.mu.Lock()
	defer s.turns.mu.Unlock()
	q := s.turns.q[name]
	for i, u := range q {
		if u != t {
			continue
		}
		q = append(q[:i], q[i+1:]...)
		if i == 0 && len(q) > 0 {
			close(q[0].ready)
		}
		break
	}
	if len(q) == 0 {
		delete(s.turns.q, name)
		return
	}
	s.turns.q[name] = q
}

// awaitTurn waits until t heads its queue, ctx ends (its cause) or the
// store closes (ErrClosed).
func (s *Store) awaitTurn(ctx context.Context, t *turn) error {
	select {
	case <-t.ready:
		return nil
	default:
	}
	s.parked.Add(1)
	defer s.parked.Add(-1)
	select {
	case <-t.ready:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-s.ctx.Done():
		return ErrClosed
	}
}
