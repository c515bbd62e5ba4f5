package leader_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
)

// TestObservedLapseEndsTerm: once a leader has read a passed trust deadline
// from TrustedUntil, its term is over, even if the evidence behind the
// deadline moves on before the elector's timer runs (a renewal or a
// session check answered late on a stalled scheduler). The Store's clock
// jumps past the lease's trust deadline and back, so the leader reads a
// lapse that nothing else notices; the term's Context must end. Before
// the fix the term went on, trusted again: a leader that stopped work on
// the lapse and waited for its Context waited for ever, holding the
// election (TestSafetyChurn's "no leader by the liveness deadline").
func TestObservedLapseEndsTerm(t *testing.T) {
	t.Parallel()
	db := setup(t)
	var off atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(off.Load())) }
	r := newReplicaWith(t, db.DSN, advisory.Config{}, lease.Config{Now: clock})
	terms := make(chan leader.Term, 1)
	e := newElector(t, r, "lapse", "A", func(c *leader.Config) { c.TTL = time.Minute })
	runWork(t, e, func(ctx context.Context, term leader.Term) error {
		terms <- term
		<-ctx.Done()
		return nil
	})
	var term leader.Term
	select {
	case term = <-terms:
	case <-ctxT(t, time.Minute).Done():
		t.Fatal("not elected")
	}
	off.Store(int64(2 * time.Minute))
	if until := term.TrustedUntil(); time.Now().Before(until) {
		t.Fatalf("trusted for %v more after the clock passed the lease's deadline", time.Until(until))
	}
	off.Store(0)
	if until := term.TrustedUntil(); time.Now().Before(until) {
		t.Errorf("after a lapse was read: trusted again, for %v more", time.Until(until))
	}
	select {
	case <-term.Context().Done():
	case <-ctxT(t, 30*time.Second).Done():
		t.Fatal("the term's Context is live 30 s after its lapse was read")
	}
}
