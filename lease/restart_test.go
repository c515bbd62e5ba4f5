package lease_test

import (
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// TestServerRestart: leases, tokens and waiters survive a server restart;
// the keep-alive rides it out and the listener reconnects.
func TestServerRestart(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t) // skipped when PGTEST_DSN is set
	db := srv.NewDB(t)
	pool := db.NewPool(t)
	s := newStore(t, pool, lease.Config{})
	ctx := ctxT(t)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	first := mustTry(t, s, "r", time.Minute)
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	held := mustTry(t, s, "r", 10*time.Second, lease.WithKeepAlive())
	waiter := make(chan *lease.Lease, 1)
	go func() {
		l, err := s.Acquire(ctx, "r", time.Minute)
		if err != nil {
			t.Error(err)
		}
		waiter <- l
	}()
	waitWaiting(t, bundle{store: s}, "r")

	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	exp := held.ExpiresAt()
	eventually(t, 20*time.Second, "a renewal after the restart", func() bool { return held.ExpiresAt().After(exp) })
	if err := held.Err(); err != nil {
		t.Fatalf("lost across the restart: %v", err)
	}
	if err := held.Assert(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var next *lease.Lease
	select {
	case next = <-waiter:
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter did not get the lease after the restart")
	}
	if next == nil {
		t.FailNow()
	}
	if first.Token() != 1 || held.Token() != 2 || next.Token() != 3 {
		t.Fatalf("tokens %d, %d, %d; want 1, 2, 3", first.Token(), held.Token(), next.Token())
	}
}
