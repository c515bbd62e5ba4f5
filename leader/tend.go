package leader

import (
	"context"
	"time"

	"github.com/pglocks/pglocks/internal/backoff"
	"github.com/pglocks/pglocks/lease"
)

// startTending runs tend for the term t on a goroutine of its own; stop
// tells it to end, wait waits until it has.
func (e *Elector) startTending(t *tenure) (stop, wait func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	e.setTending(true)
	go func() {
		defer close(done)
		defer e.setTending(false)
		e.tend(ctx, t)
	}()
	return cancel, func() { <-done }
}

// tend keeps this leader's candidate row while it leads, off the watch, so
// that no database call ever holds up the watch's reaction to the term's
// loss. It takes the row if the elector was elected before it had one.
// When the row is lost — a request breaks it (see [RequestResign]) — it
// answers the request of this term, which may end the term as Resign or
// HandOver does (through t.once: the watch sees t.resign): then it returns,
// and the campaign takes the row again once the term has ended (a retake
// here would race the step-down, which cancels it). Otherwise — a refused
// hand-over, or no request: the row was lost for another reason, logged at
// Warn — it takes the row again. A row that cannot be taken (another
// process holds it, the database does not answer) is retried with capped,
// jittered backoff up to TTL; meanwhile the leader cannot be asked
// anything. Every call is bounded by RetryInterval + 5s and ends with ctx,
// cancelled once the watch has returned — but for a try of the row already
// sent, which ends within its bound (see ensureCandidate).
func (e *Elector) tend(ctx context.Context, t *tenure) {
	bo := backoff.Backoff{Min: min(100*time.Millisecond, e.cfg.RetryInterval), Max: max(2*e.cfg.RetryInterval, e.cfg.TTL)}
	for ctx.Err() == nil {
		if c := e.candidacy(); c != nil {
			select {
			case <-ctx.Done():
				return
			case <-c.Context().Done():
			}
			if !e.dropCandidacy(c) {
				continue
			}
			var asked, ended bool
			e.bounded(ctx, func(ctx context.Context) error { asked, ended = e.answerRequest(ctx, t); return nil })
			switch {
			case ended:
				return
			case !asked && ctx.Err() != nil:
				e.lostCandidacy(c, "the term ended before a request to this leader could be read", true)
			case !asked:
				e.lostCandidacy(c, "no request to this leader found", true)
			}
			continue
		}
		err := e.bounded(ctx, e.ensureCandidate)
		switch {
		case e.candidacy() != nil:
			bo.Reset()
		case err != nil: // cannot succeed: the next campaign says why
			return
		case !sleep(ctx, bo.Next()):
			return
		}
	}
}

// bounded runs f with ctx bounded by RetryInterval + 5s (see stmt).
func (e *Elector) bounded(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := e.stmt(ctx)
	defer cancel()
	return f(ctx)
}

// stmt bounds one database call of the elector by RetryInterval + 5s,
// whatever ctx allows: on a connection gone silent (a partitioned node,
// which drops packets and sends no reset) a call would otherwise wait for
// the kernel to give up, some 15 minutes — a campaign holding the
// advisory lock meanwhile, so that no candidate could lead.
func (e *Elector) stmt(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, e.stmtBound())
}

// stmtSlack is what one database call of the elector may take beyond
// RetryInterval (see stmt).
const stmtSlack = 5 * time.Second

// stmtBound is stmt's bound: RetryInterval + stmtSlack.
func (e *Elector) stmtBound() time.Duration { return e.cfg.RetryInterval + stmtSlack }

// readTerm reads the election's lease row, bounded (see stmt).
func (e *Elector) readTerm(ctx context.Context) (lease.Info, error) {
	ctx, cancel := e.stmt(ctx)
	defer cancel()
	return e.cfg.Store.Get(ctx, e.leaseName)
}

// termBound bounds a try of the term's lease: as stmt, but at least TTL,
// as package lease bounds each try of a waiting Acquire: a commit that
// waits for a lagging synchronous standby should be slow, not cut short
// (an unknown outcome, a failed campaign) time after time.
func (e *Elector) termBound() time.Duration {
	return max(e.cfg.TTL, e.stmtBound())
}

// dropCandidacy forgets the candidate lease c, which has ended, unless
// another has replaced it or it was forgotten already. It reports whether
// it forgot c: the caller then logs c's end (once).
func (e *Elector) dropCandidacy(c *lease.Lease) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cand != c {
		return false
	}
	e.cand = nil
	return true
}

// setTending records whether a tend is under way: while it is, it logs
// the loss of the candidate row (see candidacyEnded). A tend that ends
// leaves no loss unlogged: a row that ended while it stopped is logged
// here.
func (e *Elector) setTending(on bool) {
	e.mu.Lock()
	e.tending = on
	c := e.cand
	e.mu.Unlock()
	if !on && c != nil && c.Err() != nil && e.dropCandidacy(c) {
		e.lostCandidacy(c, "", true)
	}
}
