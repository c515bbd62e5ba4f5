package leader_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
)

// An ended term is never trusted again: after a Break ends A's term, while
// A's Locker session keeps answering round trips for another lock, A's
// old Term reports a zero TrustedUntil and a done Context — before and
// after B is elected (before the fix, TrustedUntil followed the lease's
// stale deadline and the session's live VerifiedAt, and said "trusted" for
// seconds while B led).
func TestEndedTermNotTrusted(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := ctxT(t, 2*time.Minute)
	a := newReplicaWith(t, db.DSN, advisory.Config{MaxSessions: 1, PingInterval: 50 * time.Millisecond}, lease.Config{})
	app, err := a.locker.TryLock(ctx, pglocks.KeyOf("app")) // keeps A's one session busy with pings
	if err != nil {
		t.Fatal(err)
	}
	defer app.Unlock(ctx)
	terms := make(chan leader.Term, 10)
	work := func(ctx context.Context, term leader.Term) error {
		terms <- term
		<-ctx.Done()
		return nil
	}
	ea := newElector(t, a, "ended", "A", func(c *leader.Config) { c.TTL = 10 * time.Second })
	runWork(t, ea, work)
	ta := <-terms
	b := newReplica(t, db.DSN)
	eb := newElector(t, b, "ended", "B", func(c *leader.Config) { c.TTL = 10 * time.Second })
	runWork(t, eb, work)
	if _, err := a.store.Break(ctx, "pglocks.leader:ended"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ta.Context().Done():
	case <-ctx.Done():
		t.Fatal("A's term Context still live after its lease was broken")
	}
	if until := ta.TrustedUntil(); !until.IsZero() {
		t.Errorf("A's ended term: TrustedUntil %v from now, want the zero time", time.Until(until))
	}
	var tb leader.Term
	select {
	case tb = <-terms:
	case <-ctx.Done():
		t.Fatal("B was not elected")
	}
	for range 10 { // B leads; A's session keeps answering pings meanwhile
		if until := ta.TrustedUntil(); time.Now().Before(until) {
			t.Fatalf("B leads term %d while A's term %d is trusted for another %v", tb.Number, ta.Number, time.Until(until))
		}
		select {
		case <-time.After(100 * time.Millisecond): // let A's session answer more pings
		case <-ctx.Done():
		}
	}
	if (leader.Term{}).Context().Err() == nil {
		t.Error("the zero Term's Context is live")
	}
}

// A Close whose ctx ends before Run returns still closes the Locker and
// Store the Elector made for itself, once Run returns (before the fix
// they leaked, with their sessions, and a second Close returned nil).
func TestCloseBeforeRunReturnsClosesOwned(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := ctxT(t, time.Minute)
	pool, err := pgxpool.New(ctx, db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	e, err := leader.New(leader.Config{Name: "close-owned", Pool: pool, TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	elected := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- e.Run(context.Background(), func(ctx context.Context, _ leader.Term) error {
			close(elected)
			<-release // slow to return: ignores its ctx for a while
			return nil
		})
	}()
	<-elected
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := e.Close(short); err == nil {
		t.Fatal("Close returned nil although Run had not returned")
	}
	close(release)
	if err := <-done; err == nil {
		t.Log("Run returned nil")
	}
	if err := e.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// The Locker's sessions (application_name pglocks) and the Store's
	// listener are closed: only the pool's own sessions remain.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		err := pool.QueryRow(ctx, `select count(*) from pg_stat_activity
			where datname = current_database() and pid <> pg_backend_pid() and application_name like 'pglocks%'`).Scan(&n)
		if err == nil && n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the elector's own sessions left 30s after Close (%v)", n, err)
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}
