package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// TestPartitionedListenerEnds: the store's listener holds no
// lease, but its session holds shared interest locks and, behind a
// session-mode PgBouncer, a client cut off from the network leaves it on
// the server — and in PgBouncer's pool — as long as PgBouncer keeps the
// dead client (hours). It sets idle_session_timeout and sends a round trip
// every half of it whatever arrives, so the server ends it once the client
// is gone.
func TestPartitionedListenerEnds(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := ctxT(t)
	bouncer, bdsn := db.Bouncer(t, pgtest.PoolSession)
	p := pgtest.NewProxy(t, bouncer.Addr(), pgtest.Partitionable())
	pdsn, err := pgtest.ViaProxy(bdsn, p)
	if err != nil {
		t.Fatal(err)
	}
	app := "lease-cut-listener-" + db.Name
	pool := pgtest.NewPool(t, pdsn, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = app })
	s := newStore(t, pool, lease.Config{})
	l, err := s.TryAcquire(ctx, "cut-listener", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// A waiter makes the listener take an interest lock on its session.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _, _ = s.Acquire(wctx, "cut-listener", time.Second) }()
	direct := db.Conn(t)
	var pid int32
	waitCut(t, "the listener's session to hold an interest lock", 30*time.Second, func() bool {
		err := direct.QueryRow(ctx, `select a.pid from pg_stat_activity a join pg_locks l using (pid)
			where a.application_name = $1 and l.locktype = 'advisory' and l.mode = 'ShareLock' limit 1`, app).Scan(&pid)
		return err == nil
	})
	if err := p.Partition(); err != nil {
		t.Fatal(err)
	}
	defer p.Pass()
	start := time.Now()
	waitCut(t, "the partitioned listener's backend to end", 30*time.Second, func() bool {
		var n int
		if err := direct.QueryRow(ctx, "select count(*) from pg_stat_activity where pid = $1", pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	t.Logf("the listener's backend (pid %d) ended %v after the cut", pid, time.Since(start).Round(time.Millisecond))
	cancel()
	p.Pass()
	_ = l.Release(ctx) // the lease may be over: its connection was cut
}

// waitCut polls cond until it is true or d passes.
func waitCut(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		<-time.After(20 * time.Millisecond)
	}
}
