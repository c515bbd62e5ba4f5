package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/pglocks/pglocks/internal/routetest"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// TestWaiterAfterSilence: a waiter in Acquire whose connections go silent
// (a partitioned primary: no reply, no reset) while it waits, and whose DSN
// lists a reachable server after the silent one, acquires once the name
// is free: each of its tries is bounded, so a try stuck on a silent
// connection ends (an unknown outcome, cleaned up) and the next one dials
// the reachable host. Before, the try waited on the silent connection
// for as long as the caller's ctx allowed.
func TestWaiterAfterSilence(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db := pgtest.New(t)
	admin := db.NewPool(t)
	holder := newStore(t, admin, lease.Config{})
	if err := holder.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	p, _ := db.Proxy(t)
	// Through the proxy while it passes.
	dsn := routetest.FirstHost(t, db.DSN, p.Addr(), map[string]string{"connect_timeout": "2", "application_name": "silent-waiter"})
	waiter := newStore(t, pgtest.NewPool(t, dsn), lease.Config{})

	const ttl = 3 * time.Second
	held, err := holder.Acquire(ctx, "silent", ttl, lease.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	start := time.Now()
	go func() {
		l, err := waiter.Acquire(ctx, "silent", ttl)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	// The waiter's first try found the name held; then its connections
	// (pooled, and its listener's) go silent, and the name is released.
	// Its listener holds an interest lock on the name once it listens for
	// its release (the text of its LISTEN is replaced by the next
	// statement's within milliseconds: not a thing to poll for).
	waitCut(t, "the waiter's listener to hold its interest lock", time.Minute, func() bool {
		var listening bool
		err := admin.QueryRow(ctx, `select exists (select from pg_stat_activity a join pg_locks l using (pid)
			where a.application_name = 'silent-waiter' and l.locktype = 'advisory' and l.mode = 'ShareLock')`).Scan(&listening)
		return err == nil && listening
	})
	p.Blackhole()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
		t.Logf("the waiter acquired %v after its connections went silent", time.Since(start))
	case <-time.After(2 * time.Minute):
		t.Fatal("the waiter did not acquire within 2 minutes of its connections going silent")
	}
}
