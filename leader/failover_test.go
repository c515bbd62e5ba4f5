package leader_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/pgtest"
)

// clusterDB returns a cluster and a fresh database on it with the lease
// table, reached through the cluster's multi-host DSN.
func clusterDB(t *testing.T, opts ...pgtest.Option) (*pgtest.Cluster, *pgtest.DB) {
	t.Helper()
	c := pgtest.NewCluster(t, opts...)
	db := c.NewDB(t)
	migrate(t, db)
	ctx := ctxT(t, time.Minute)
	if err := c.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	return c, db
}

// newest returns the newest event waiting in ch, else ev.
func newest(ch <-chan event, ev event) event {
	for {
		select {
		case ev = <-ch:
		default:
			return ev
		}
	}
}

// TestFailoverSyncStandby fails a synchronous cluster over 5 times
// (LEADER_TRIALS, if set: the README's figures are from 20; the
// former primary rejoins as the standby each time) under two candidates
// with connections through the multi-host DSN: each time the leader is
// demoted, a new leader is elected on the new primary, and its term is
// above the last one. It reports the time from the completed promotion to
// the new leader (median, max).
func TestFailoverSyncStandby(t *testing.T) {
	t.Parallel()
	c, db := clusterDB(t, pgtest.WithSynchronousStandby())
	elected := make(chan event, 100)
	cands := map[string]*candidate{}
	for _, id := range []string{"a", "b"} {
		cands[id] = startCandidateTo(t, newReplica(t, db.DSN), "ha", id, nil, elected)
	}
	trials := trials(t, 5)
	var afterPromotion, afterStop []time.Duration
	ev := waitEvent(t, elected, "first election")
	for i := range trials {
		ctx := ctxT(t, 3*time.Minute)
		stop := time.Now()
		if _, err := c.Promote(ctx); err != nil {
			t.Fatal(err)
		}
		promoted := time.Now()
		d := newest(cands[ev.who].demoted, waitEvent(t, cands[ev.who].demoted, "the old leader's demotion"))
		next := waitEvent(t, elected, "a new leader")
		if next.term.Number <= ev.term.Number {
			t.Fatalf("trial %d: term %d after term %d", i, next.term.Number, ev.term.Number)
		}
		if !d.at.Before(next.at) {
			t.Fatalf("trial %d: new leader elected at %v before the old one stepped down at %v", i, next.at, d.at)
		}
		afterPromotion = append(afterPromotion, next.at.Sub(promoted))
		afterStop = append(afterStop, next.at.Sub(stop))
		ev = next
		if i < trials-1 {
			if err := c.Rejoin(ctx); err != nil {
				t.Fatal(err)
			}
			ev = newest(elected, ev) // none unless one was re-elected meanwhile
		}
	}
	t.Logf("promotion → new leader over %d failovers: %s; primary stop → new leader: %s; last term %d",
		trials, summary(afterPromotion), summary(afterStop), ev.term.Number)
}

// TestFailoverAsyncStandbyTermsGrow fails over to an asynchronous standby
// that fell behind while three terms began (its WAL receiver stopped):
// the new primary's counter is three terms back. Both candidates had seen
// the latest term, so the regressed term is refused (lease.ErrTokenRegressed,
// retried by the campaign) and the new leader's term is above every term
// before the failover.
func TestFailoverAsyncStandbyTermsGrow(t *testing.T) {
	t.Parallel()
	c, db := clusterDB(t)
	ctx := ctxT(t, 3*time.Minute)
	elected := make(chan event, 100)
	var mu sync.Mutex
	seen := map[string]int64{} // the highest term each candidate saw
	cands := map[string]*candidate{}
	for _, id := range []string{"a", "b"} {
		cands[id] = startCandidateTo(t, newReplica(t, db.DSN), "ha", id, func(cfg *leader.Config) {
			cfg.OnNewLeader = func(l leader.Leader) {
				mu.Lock()
				seen[id] = max(seen[id], l.Term)
				mu.Unlock()
			}
		}, elected)
	}
	ev := waitEvent(t, elected, "first election")
	if err := c.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.PauseReplication(ctx); err != nil {
		t.Fatal(err)
	}
	first := ev.term.Number
	for range 3 {
		if err := cands[ev.who].e.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		ev = waitEvent(t, elected, "the next leader")
	}
	last := ev.term.Number
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		mu.Lock()
		both := seen["a"] >= last && seen["b"] >= last
		mu.Unlock()
		if both {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the candidates did not both see term %d", last)
		case <-time.After(delay):
		}
	}
	if _, err := c.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	next := waitEvent(t, elected, "a leader after the failover")
	if next.term.Number <= last {
		t.Fatalf("term %d after the failover, but term %d began before it (the standby had only term %d)",
			next.term.Number, last, first)
	}
	t.Logf("terms %d..%d lost with the standby's lag; new leader %s in term %d, %v after the promotion",
		first+1, last, next.who, next.term.Number, next.at.Sub(promoted).Round(time.Millisecond))
}

// TestStandbyRefused: an Elector pointed at a standby by mistake fails at
// once: Run returns the Locker's advisory.ErrStandby.
func TestStandbyRefused(t *testing.T) {
	t.Parallel()
	c, db := clusterDB(t)
	ctx := ctxT(t, time.Minute)
	r := newReplica(t, c.StandbyDSN(db.Name))
	e, err := leader.New(leader.Config{Name: "standby", Pool: r.pool, Locker: r.locker, Store: r.store})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	start := time.Now()
	err = e.Run(ctx, func(ctx context.Context, _ leader.Term) error { return nil })
	if !errors.Is(err, advisory.ErrStandby) {
		t.Fatalf("Run on a standby: %v, want advisory.ErrStandby", err)
	}
	t.Logf("Run: %v after %v", err, time.Since(start).Round(time.Millisecond))
}
