package leader_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/pgtest"
)

// TestPartitionedObserveEnds: Observe's LISTEN connection holds
// nothing, but behind a session-mode PgBouncer a follower cut off from the
// network leaves it on the server — and in PgBouncer's pool — as long as
// PgBouncer keeps the dead client (hours). It sets idle_session_timeout
// and sends a round trip every half of it whatever arrives, so the server
// ends it once the follower is gone.
func TestPartitionedObserveEnds(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := ctxT(t, 2*time.Minute)
	bouncer, bdsn := db.Bouncer(t, pgtest.PoolSession)
	p := pgtest.NewProxy(t, bouncer.Addr(), pgtest.Partitionable())
	pdsn, err := pgtest.ViaProxy(bdsn, p)
	if err != nil {
		t.Fatal(err)
	}
	app := "observe-cut-" + db.Name
	pool := pgtest.NewPool(t, pdsn, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = app })
	r := newReplica(t, db.DSN)
	e := newElector(t, replica{pool: pool, locker: r.locker, store: r.store}, "observe-cut", "follower", nil)
	ch := e.Observe(ctx)
	if _, ok := <-ch; !ok {
		t.Fatal("Observe's channel closed at once")
	}
	direct := db.Conn(t)
	var pid int32
	waitCut(t, "Observe's LISTEN connection", 30*time.Second, func() bool {
		err := direct.QueryRow(ctx, `select pid from pg_stat_activity
			where application_name = $1 and query ilike 'listen%' limit 1`, app).Scan(&pid)
		return err == nil
	})
	if err := p.Partition(); err != nil {
		t.Fatal(err)
	}
	defer p.Pass()
	start := time.Now()
	waitCut(t, "the partitioned Observe's backend to end", 30*time.Second, func() bool {
		var n int
		if err := direct.QueryRow(ctx, "select count(*) from pg_stat_activity where pid = $1", pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	t.Logf("Observe's backend (pid %d) ended %v after the cut", pid, time.Since(start).Round(time.Millisecond))
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
