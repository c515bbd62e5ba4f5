package leader_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/routetest"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// TestCampaignOnSilentConn: a campaign that holds the advisory lock and
// reads or takes the lease on a pooled connection gone silent (a
// partitioned node drops packets and sends no reset) gives up within its
// bound, releases the lock, and is elected on a fresh connection.
// Unbounded, the call waited for the kernel to give up (some 15 minutes)
// holding the lock, so that no candidate could lead. The Store's one
// connection is dialled by a DialFunc the test points at a proxy, which
// then goes silent with that connection idle in the pool, and at the
// server from then on. The first call after the lock (the read of a
// hand-over reservation) gets the silent connection; the election comes
// some 20 s later: its 5.1 s bound, then the pool's slot freed once pgx
// has given up draining the dead connection (15 s).
func TestCampaignOnSilentConn(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := ctxT(t, 2*time.Minute)
	p, _ := db.Proxy(t)
	server, err := db.Server.Addr()
	if err != nil {
		t.Fatal(err)
	}
	route := routetest.To(p.Addr())
	pool := pgtest.NewPool(t, db.DSN, func(c *pgxpool.Config) {
		c.MaxConns = 1 // the campaign's try gets the silent one
		c.ConnConfig.DialFunc = route.Dial
	})
	st, err := lease.New(pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	if _, err := st.Get(ctx, "warm"); err != nil && !errors.Is(err, lease.ErrNotFound) {
		t.Fatal(err)
	}
	route.Move(server)
	p.Blackhole()

	direct := newReplica(t, db.DSN)
	elected := make(chan event, 10)
	start := time.Now()
	startCandidateTo(t, replica{pool: direct.pool, locker: direct.locker, store: st}, "silentconn", "a",
		func(c *leader.Config) { c.RetryInterval = 100 * time.Millisecond }, elected)
	select {
	case ev := <-elected:
		t.Logf("elected in term %d %v after the Store's connection went silent (each call bounded by 5.1 s)", ev.term.Number, time.Since(start).Round(time.Millisecond))
	case <-time.After(time.Minute):
		t.Fatal("no election within a minute: the campaign's try waits on the silent connection")
	}
}
