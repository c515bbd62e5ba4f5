package leader_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/pgtest"
)

// viaSessionBouncer names the test whose subtests run the leader behaviour
// tests with every replica connecting through a session-mode PgBouncer.
const viaSessionBouncer = "TestViaSessionBouncer/"

var bouncers sync.Map // direct DSN → the same database through a bouncer

// viaPooler returns dsn, or under TestViaSessionBouncer the same database
// through a session-mode PgBouncer shared by the test's replicas.
func viaPooler(t *testing.T, dsn string) string {
	t.Helper()
	if !strings.HasPrefix(t.Name(), viaSessionBouncer) {
		return dsn
	}
	if v, ok := bouncers.Load(dsn); ok {
		return v.(string)
	}
	b := pgtest.NewBouncer(t, pgtest.SharedServer(t), pgtest.PoolSession)
	bdsn, err := b.DSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	bouncers.Store(dsn, bdsn)
	t.Cleanup(func() { bouncers.Delete(dsn) })
	return bdsn
}

// TestViaSessionBouncer runs the leader behaviour tests through a real
// PgBouncer in session mode: elected, failed over after a resignation and
// after the leader's session is terminated, fenced, observed.
func TestViaSessionBouncer(t *testing.T) {
	t.Parallel()
	for name, test := range map[string]func(*testing.T){
		"SingleCandidate":         TestSingleCandidate,
		"FailoverInProcess":       TestFailoverInProcess,
		"TermFencing":             TestTermFencing,
		"Observe":                 TestObserve,
		"ObserveReadsOnlyOwnNews": TestObserveReadsOnlyOwnNews,
	} {
		t.Run(name, test)
	}
}

// TestRunRefusedBehindTransactionPooling: behind a transaction-mode
// PgBouncer the campaign's session lock is refused, and an elector told to
// campaign in ModeSession makes Run return advisory.ErrTransactionPooling at
// once instead of campaigning forever (in ModeAuto it campaigns on the
// lease alone: TestLeaseOnlyBehindTransactionPooling).
func TestRunRefusedBehindTransactionPooling(t *testing.T) {
	t.Parallel()
	db := setup(t)
	_, dsn := db.Bouncer(t, pgtest.PoolTransaction)
	pool := pgtest.NewPool(t, dsn, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec })
	e, err := leader.New(leader.Config{Name: "pooled", Pool: pool, Mode: leader.ModeSession})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	ctx := ctxT(t, time.Minute)
	start := time.Now()
	err = e.Run(ctx, func(context.Context, leader.Term) error { return nil })
	if !errors.Is(err, advisory.ErrTransactionPooling) {
		t.Fatalf("Run behind transaction pooling: %v, want ErrTransactionPooling", err)
	}
	t.Logf("Run returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
}

// TestObservePollsBehindTransactionPooling: an Observe whose pool is behind
// a transaction-mode PgBouncer does not LISTEN (a probe tells it) and polls
// every RetryInterval: it still sees an election and a step-down.
func TestObservePollsBehindTransactionPooling(t *testing.T) {
	t.Parallel()
	db := setup(t)
	_, dsn := db.Bouncer(t, pgtest.PoolTransaction)
	pool := pgtest.NewPool(t, dsn) // pgx's default exec mode: cache_statement
	watcher, err := leader.New(leader.Config{Name: "polled", Pool: pool, RetryInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = watcher.Close(context.Background()) })
	ctx := ctxT(t, time.Minute)
	updates := watcher.Observe(ctx)
	next := func(what string) (leader.Leader, time.Time) {
		t.Helper()
		select {
		case l := <-updates:
			return l, time.Now()
		case <-ctx.Done():
			t.Fatalf("no update: %s", what)
			return leader.Leader{}, time.Time{}
		}
	}
	if l, _ := next("initial state"); l.Held {
		t.Fatalf("initial state %+v, want no leader", l)
	}
	c := startCandidate(t, newReplica(t, db.DSN), "polled", "poll-1", nil)
	ev := waitEvent(t, c.elected, "election")
	l, seen := next("election")
	if !l.Held || l.Identity != "poll-1" || l.Term != ev.term.Number {
		t.Fatalf("after election: %+v", l)
	}
	t.Logf("election seen by polling %v after it happened", seen.Sub(ev.at).Round(time.Millisecond))
	c.stop(t) // steps down, releases, and does not run again
	if l, _ := next("step-down"); l.Held {
		t.Fatalf("after the leader stopped: %+v", l)
	}
}
