package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/routetest"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// TestListenerStatementOnSilentConn: a statement of the store's listening
// connection sent after the connection went silent (a partitioned node
// drops packets, no reset) ends within its bound, and the listener opens
// a session elsewhere. A second waiter makes the listener take another
// interest lock just after a heartbeat (seen on the server), so that no
// heartbeat comes first: the statement waited for the kernel (some 15
// minutes), and the store heard no release meanwhile. The store's
// connections are dialled by a DialFunc the test points at a proxy, then
// (the pool reset) at the server: only the listening connection is left
// on the proxy when it goes silent.
func TestListenerStatementOnSilentConn(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, _ := db.Proxy(t)
	server, err := db.Server.Addr()
	if err != nil {
		t.Fatal(err)
	}
	route := routetest.To(p.Addr())
	app := "lease-silent-listener-" + db.Name
	pool := pgtest.NewPool(t, db.DSN, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["application_name"] = app
		c.ConnConfig.DialFunc = route.Dial
	})
	s := newStore(t, pool, lease.Config{})
	holder := newStore(t, db.NewPool(t), lease.Config{})
	for _, name := range []string{"silent-a", "silent-b"} {
		if _, err := holder.TryAcquire(ctx, name, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	wctx, leave := context.WithCancel(ctx)
	defer leave()
	go func() { _, _ = s.Acquire(wctx, "silent-a", time.Second) }()
	direct := db.Conn(t)
	var pid int32
	var beat time.Time
	waitCut(t, "the listener's session to hold an interest lock", 30*time.Second, func() bool {
		err := direct.QueryRow(ctx, `select a.pid, a.state_change from pg_stat_activity a join pg_locks l using (pid)
			where a.application_name = $1 and l.locktype = 'advisory' and l.mode = 'ShareLock' limit 1`, app).Scan(&pid, &beat)
		return err == nil
	})
	waitCut(t, "a heartbeat of the listener", 30*time.Second, func() bool {
		var at time.Time
		err := direct.QueryRow(ctx, "select state_change from pg_stat_activity where pid = $1", pid).Scan(&at)
		return err == nil && at.After(beat)
	})
	route.Move(server)
	pool.Reset()
	p.Blackhole()
	start := time.Now()
	go func() { _, _ = s.Acquire(wctx, "silent-b", time.Second) }()
	waitCut(t, "a new listening session on the server", time.Minute, func() bool {
		var n int
		err := direct.QueryRow(ctx, `select count(*) from pg_stat_activity a join pg_locks l using (pid)
			where a.application_name = $1 and a.pid <> $2 and l.locktype = 'advisory' and l.mode = 'ShareLock'`, app, pid).Scan(&n)
		return err == nil && n == 2
	})
	t.Logf("a new listening session holds both interest locks %v after the silence", time.Since(start).Round(time.Millisecond))
}
