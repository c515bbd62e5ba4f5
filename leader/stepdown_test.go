package leader_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// TestSharedSessionNeverDemoted: process A leads "slow"
// and "healthy" with both campaign locks on one Locker session; slow's work
// holds a guarded transaction past its TTL, so slow's lease expires; B,
// campaigning for slow, must not terminate the session that also holds
// healthy's lock. Healthy is never demoted.
func TestSharedSessionNeverDemoted(t *testing.T) {
	t.Parallel()
	db := setup(t)
	a := newReplicaWith(t, db.DSN, advisory.Config{MaxSessions: 1}, lease.Config{})
	b := newReplica(t, db.DSN)
	ttl := func(cfg *leader.Config) { cfg.TTL = 2 * time.Second }
	healthy := startCandidate(t, a, "healthy", "a", ttl)
	waitEvent(t, healthy.elected, "healthy's election")

	slowElected := make(chan event, 100)
	slowDone := make(chan struct{})
	slow := newElector(t, a, "slow", "a", ttl)
	first := true
	runWork(t, slow, func(ctx context.Context, term leader.Term) error {
		slowElected <- event{who: "a", term: term, at: time.Now()}
		if first {
			first = false
			// A guarded transaction that outlives the TTL, ignoring ctx.
			tctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = pgx.BeginFunc(tctx, a.pool, func(tx pgx.Tx) error {
				if err := term.Guard(tctx, tx); err != nil {
					return err
				}
				<-time.After(4 * time.Second) // the slow external call: the fault
				return nil
			})
			close(slowDone)
		}
		<-ctx.Done()
		return nil
	})
	waitEvent(t, slowElected, "slow's election")
	runWork(t, newElector(t, b, "slow", "b", ttl), func(ctx context.Context, term leader.Term) error {
		slowElected <- event{who: "b", term: term, at: time.Now()}
		<-ctx.Done()
		return nil
	})
	select {
	case <-slowDone:
	case <-time.After(30 * time.Second):
		t.Fatal("slow's work did not return")
	}
	next := waitEvent(t, slowElected, "slow's next term")
	t.Logf("slow's next term %d went to %s", next.term.Number, next.who)
	select { // and a little longer, for a late terminate
	case d := <-healthy.demoted:
		t.Fatalf("healthy was demoted: %v", d.reason)
	case <-time.After(2 * time.Second):
	}
}

// TestWorkIgnoringCtxDoesNotDelayFailover: a leader
// whose lease is broken steps down — unlocks its campaign lock — at once,
// although its work ignores cancellation, so another candidate is elected
// within about the lease's renewal interval.
func TestWorkIgnoringCtxDoesNotDelayFailover(t *testing.T) {
	t.Parallel()
	db := setup(t)
	a, b := newReplica(t, db.DSN), newReplica(t, db.DSN)
	release := make(chan struct{})
	elected := make(chan event, 100)
	ea := newElector(t, a, "stubborn", "a", nil)
	runWork(t, ea, func(ctx context.Context, term leader.Term) error {
		elected <- event{who: "a", term: term}
		<-release // ignores ctx
		return nil
	})
	t.Cleanup(func() { close(release) }) // runs before Run's cleanup
	waitEvent(t, elected, "a's election")
	runWork(t, newElector(t, b, "stubborn", "b", nil), func(ctx context.Context, term leader.Term) error {
		elected <- event{who: "b", term: term}
		<-ctx.Done()
		return nil
	})
	start := time.Now()
	if _, err := b.store.Break(ctxT(t, 30*time.Second), "pglocks.leader:stubborn"); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-elected:
		t.Logf("%s elected %v after the Break", ev.who, time.Since(start).Round(time.Millisecond))
	case <-time.After(10 * time.Second): // TTL 3s
		t.Fatal("no new leader within 10s of breaking the lease of a leader whose work ignores ctx")
	}
}

// TestCloseDuringRun: Close while Run campaigns or leads makes Run return
// promptly with ErrClosed, also when the Locker and Store are the caller's.
func TestCloseDuringRun(t *testing.T) {
	t.Parallel()
	db := setup(t)
	r := newReplica(t, db.DSN)
	elected := make(chan event, 10)
	work := func(ctx context.Context, term leader.Term) error {
		elected <- event{term: term}
		<-ctx.Done()
		return nil
	}
	leading := newElector(t, r, "closing", "l", nil)
	waiting := newElector(t, newReplica(t, db.DSN), "closing", "w", nil)
	runL := make(chan error, 1)
	go func() { runL <- leading.Run(context.Background(), work) }()
	waitEvent(t, elected, "election")
	runW := make(chan error, 1)
	go func() { runW <- waiting.Run(context.Background(), work) }()
	for deadline := time.Now().Add(30 * time.Second); !waiting.State().Running; {
		if time.Now().After(deadline) {
			t.Fatal("Run did not start")
		}
		<-time.After(time.Millisecond) // polling a condition, with a deadline
	}
	for _, c := range []struct {
		name string
		e    *leader.Elector
		run  chan error
	}{{"campaigning", waiting, runW}, {"leading", leading, runL}} {
		start := time.Now()
		if err := c.e.Close(ctxT(t, 30*time.Second)); err != nil {
			t.Errorf("%s: Close: %v", c.name, err)
		}
		select {
		case err := <-c.run:
			t.Logf("%s: Run returned %v after Close began: %v", c.name, time.Since(start).Round(time.Millisecond), err)
			if !errors.Is(err, leader.ErrClosed) {
				t.Errorf("%s: Run returned %v, want ErrClosed", c.name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Run did not return within 10s of Close", c.name)
		}
	}
}

// TestTerminateSparesSharedSession: a partitioned leader whose campaign
// lock shares its session with an application lock is not terminated when
// its lease expires — the candidates wait for the server to drop the
// session instead — so the application lock is not lost to another
// election's takeover.
func TestTerminateSparesSharedSession(t *testing.T) {
	t.Parallel()
	db := setup(t)
	proxy, dsn := db.Proxy(t, pgtest.Partitionable())
	a := newReplicaWith(t, dsn, advisory.Config{MaxSessions: 1}, lease.Config{})
	b := newReplica(t, db.DSN)
	const ttl = 2 * time.Second
	short := func(cfg *leader.Config) { cfg.TTL = ttl }
	ca := startCandidate(t, a, "shared", "a", short)
	waitEvent(t, ca.elected, "a's election")
	ctx := ctxT(t, time.Minute)
	app, err := a.locker.Lock(ctx, pglocks.KeyOf("an application lock"))
	if err != nil {
		t.Fatal(err)
	}
	pid := app.PID()
	cb := startCandidate(t, b, "shared", "b", short)
	if err := proxy.Partition(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Pass) // before the candidates stop
	waitEvent(t, ca.demoted, "the partitioned leader's demotion")
	select { // the lease expires at TTL; candidates look every RetryInterval
	case ev := <-cb.elected:
		t.Errorf("b elected in term %d: the shared session was terminated", ev.term.Number)
	case <-time.After(ttl + 3*time.Second):
	}
	var alive bool
	if err := db.Conn(t).QueryRow(ctx, "select exists (select from pg_stat_activity where pid = $1)",
		int32(pid)).Scan(&alive); err != nil {
		t.Fatal(err)
	}
	if !alive {
		t.Errorf("the session %d holding an application lock was terminated", pid)
	}
	// The wait is not silent: State says why no candidate leads.
	if st := cb.e.State(); !errors.Is(st.LastError, leader.ErrStaleLeader) {
		t.Errorf("b's State().LastError = %v, want ErrStaleLeader", st.LastError)
	}
}
