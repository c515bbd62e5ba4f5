package lease

import (
	"slices"
	"sync"
	"time"
)

// Batches: under load, a store combines its statements of one kind that
// overlap in time — the fast retakes of names it released (fastManySQL)
// and the releases (releaseManySQL) — into one statement and one commit,
// a group commit on the client. Alone, a call runs its own statement, as
// it would without batching: up to directMax calls of a kind do at once.
// A call that finds them all in flight joins the kind's queue, and one
// goroutine at a time runs the whole queue as one statement, then the
// queue that gathered meanwhile, and so on. Under load a store then pays
// one round trip, one statement and one WAL flush for many calls.
//
// A batch statement waits for no row lock (SKIP LOCKED): a call whose row
// is locked by another transaction (a Guard, a racing acquire) gets no
// row from it and goes on alone, exactly as if its statement of its own
// had found the row not released or not held; a batch never waits behind
// a guarded transaction, and two batches cannot deadlock.
//
// A batched call has the three outcomes its own statement would have:
// done (the batch answered for it), not done (its ctx ended while it was
// still queued: outcome.MarkNotSent; or the batch failed without running),
// or unknown (the batch was sent and no answer came, or its ctx ended
// while the batch ran). A batch runs on a context of its own, so that one
// caller that gives up does not cancel the others' statement; what that
// caller may have been granted is settled by the batch goroutine once the
// outcome is known (see fastBatch).
type combiner[T any] struct {
	mu       sync.Mutex
	direct   int  // calls running a statement of their own
	queue    []*T // waiting for the next batch
	batching bool // a batch goroutine runs
}

const (
	// directMax is how many calls of a kind run alone at once, per store.
	directMax = 4
	// maxBatch bounds the calls of one batch statement.
	maxBatch = 1000
	// batchTimeout bounds a batch statement, which waits for no row lock.
	batchTimeout = 30 * time.Second
)

// join admits it: alone (direct: run the statement alone, then call
// alone), or queued; start says the caller must start the batch
// goroutine, which is then counted as running.
func (c *combiner[T]) join(it *T) (direct, start bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.direct < directMax {
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

// runBatches runs the batches of c with run until the queue is empty. The
// caller counted it in s.wg.
func runBatches[T any](s *Store, c *combiner[T], run func([]*T)) {
	defer s.wg.Done()
	for batch := c.take(); batch != nil; batch = c.take() {
		run(batch)
	}
}
