package lease

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pglocks/pglocks/internal/outcome"
)

// Batches: under load, a store combines its statements of one kind that
// overlap in time — the fast retakes of names it released (fastManySQL)
// and the releases (releaseManySQL) — into one statement and one commit,
// a group commit on the client. Alone, a call runs its own statement, as
// it would without batching: up to Config.BatchAfter calls of a kind do at
// once.
// A call that finds them all in flight joins the kind's queue, and one
// goroutine at a time runs the whole queue as one statement, then the
// queue that gathered meanwhile, and so on. Under load a store then pays
// one round trip, one statement and one WAL flush for many calls.
//
// A batch statement waits for no row lock (SKIP LOCKED): a call whose row
// is locked by another transaction (a Guard, a racing writer) gets no
// row from it and goes on alone, exactly as if its statement of its own
// had found the row not released or not held; a batch never waits behind
// a guarded transaction, and no batch waits for another.
//
// A batched call has the three outcomes its own statement would have:
//   - done: the batch answered for it;
//   - not done: its ctx ended while it was still queued (the error is
//     marked with outcome.MarkNotSent), or the batch failed without
//     running, or for a reason of its own — then every call of the batch
//     runs its statement alone, so that one call's bad input fails no
//     other;
//   - unknown: the batch was sent and no answer came, or the call's ctx
//     ended while its batch ran. A batch runs on a context of its own, so
//     that one caller that gives up does not cancel the others' statement;
//     what a caller that gave up may have been granted is settled by the
//     batch goroutine once the batch's outcome is known (see fastBatch).
type combiner[T any] struct {
	mu       sync.Mutex
	direct   int  // calls running a statement of their own
	queue    []*T // waiting for the next batch
	batching bool // a batch goroutine runs
}

const (
	// maxBatch bounds the calls of one batch statement (and the advisory
	// locks a release batch holds until its commit: see releaseManySQL).
	maxBatch = 128
	// batchTimeout bounds a batch, which waits for no row lock.
	batchTimeout = 30 * time.Second
)

// The states of a queued call's ticket: waiting, then answered by its
// batch or abandoned by its caller (whose ctx ended while the batch ran),
// exactly one of the two.
const (
	queuedWaiting int32 = iota
	queuedAnswered
	queuedAbandoned
)

// ticket is where a queued call gets its answer R from its batch.
type ticket[R any] struct {
	state atomic.Int32 // queuedWaiting, then queuedAnswered or queuedAbandoned
	done  chan R       // buffered: a batch never waits for its caller
}

func newTicket[R any]() ticket[R] { return ticket[R]{done: make(chan R, 1)} }

// answer hands r to the call, unless its caller abandoned it; it reports
// whether it did.
func (t *ticket[R]) answer(r R) bool {
	if !t.state.CompareAndSwap(queuedWaiting, queuedAnswered) {
		return false
	}
	t.done <- r
	return true
}

// abandoned reports whether the call's caller gave up on it.
func (t *ticket[R]) abandoned() bool { return t.state.Load() == queuedAbandoned }

// join admits it: alone (direct: run the statement alone, then call
// alone) while fewer than limit calls run alone (any number if limit is
// negative), else queued; start says the caller must start the batch
// goroutine, which is then counted as running.
func (c *combiner[T]) join(it *T, limit int) (direct, start bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.direct < limit || limit < 0 {
		c.direct++
		return true, false
	}
	c.queue = append(c.queue, it)
	start = !c.batching
	c.batching = true
	return false, start
}

// alone ends a call that ran alone.
func (c *combiner[T]) alone() {
	c.mu.Lock()
	c.direct--
	c.mu.Unlock()
}

// dequeue removes it from the queue, if no batch has taken it yet.
func (c *combiner[T]) dequeue(it *T) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.Index(c.queue, it)
	if i >= 0 {
		c.queue = slices.Delete(c.queue, i, i+1)
	}
	return i >= 0
}

// take returns the next batch, at most maxBatch calls; none ends the batch
// goroutine.
func (c *combiner[T]) take() []*T {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := min(len(c.queue), maxBatch)
	if n == 0 {
		c.batching = false
		return nil
	}
	batch := slices.Clone(c.queue[:n])
	c.queue = slices.Delete(c.queue, 0, n)
	return batch
}

// admit admits it to c (see join) under the store's Config.BatchAfter and
// starts the batch goroutine, counted in s.wg, when it must; run runs a
// batch. It reports whether the caller runs its statement alone, after
// which it calls c.alone. The caller must be inside enter/exit.
func admit[T any](s *Store, c *combiner[T], it *T, run func([]*T)) (direct bool) {
	direct, start := c.join(it, s.cfg.BatchAfter)
	if start {
		s.wg.Add(1) // inside enter/exit: Close waits for the batches
		go func() {
			defer s.wg.Done()
			for batch := c.take(); batch != nil; batch = c.take() {
				run(batch)
			}
		}()
	}
	return direct
}

// await waits for the answer to it, a call queued in c, on its ticket t,
// or for ctx to end. A call still queued then is taken out of the queue:
// it was never sent (an error marked with outcome.MarkNotSent). A call a
// batch took is abandoned (abandoned true) unless its answer came
// meanwhile: its outcome is unknown, whatever ctx's cause says.
func await[T, R any](ctx context.Context, c *combiner[T], it *T, t *ticket[R]) (r R, abandoned bool, err error) {
	select {
	case r = <-t.done:
		return r, false, nil
	case <-ctx.Done():
	}
	if c.dequeue(it) {
		return r, false, outcome.MarkNotSent(fmt.Errorf("waited for a batch: %w", ctx.Err()))
	}
	if t.state.CompareAndSwap(queuedWaiting, queuedAbandoned) {
		return r, true, nil
	}
	return <-t.done, false, nil // answered meanwhile
}

// givenUp is the error of a call whose ctx ended while its batch ran: an
// unknown outcome. It wraps ctx.Err(), which outcome.Of classifies as
// Unknown, and not ctx's cause, which could classify as anything.
func givenUp(ctx context.Context) error {
	return fmt.Errorf("%w: gave up while its batch ran (%v): %w", errUnknown, context.Cause(ctx), ctx.Err())
}

// onConn runs f on a connection of the pool and returns the backend that
// ran it, with the time just before f: its pid is 0 when nothing can still
// be running there (the connection is open, or a pooler's pid names no
// server backend; see cleanup). A zero sent time says no connection was
// had and nothing was sent: err is then the pool's error, marked so.
func (s *Store) onConn(ctx context.Context, f func(querier) error) (backend, error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return backend{}, outcome.MarkNotSent(err)
	}
	b := backend{pid: c.Conn().PgConn().PID(), sent: s.cfg.Now()}
	err = f(s.pool.on(c))
	if !c.Conn().IsClosed() || s.pool.pooled() {
		b.pid = 0
	}
	c.Release()
	return b, err
}
