package leader_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/internal/logtest"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
)

// TestCampaignEndKeepsRowTry: a campaign whose lock is granted while its
// watcher's try of the candidate row is on the wire lets that try finish.
// Cancelled, the try's outcome was unknown: its Store logged "acquire
// failed" at Warn, and "acquire succeeded again" at Warn for the term that
// followed, in every process whose first lock took longer than a
// RetryInterval (a loaded machine, a slow probe). The candidate's Store
// talks through a proxy that delays each way by half a second, so the try's
// reply is still on its way back when the test, having seen the row on
// the server, makes the leader resign.
func TestCampaignEndKeepsRowTry(t *testing.T) {
	t.Parallel()
	db := setup(t)
	const name, oneWay = "rowtry", 500 * time.Millisecond
	elected := make(chan event, 10)
	// The holder sits out 4–6 s after it resigns: a is elected, however
	// slow its wake-up on a loaded machine.
	holder := startCandidateTo(t, newReplica(t, db.DSN), name, "holder", func(c *leader.Config) {
		c.RetryInterval, c.TTL = 5*time.Second, 20*time.Second
	}, elected)
	waitEvent(t, elected, "the holder's election")

	p, slowDSN := db.Proxy(t)
	rec, logger := logtest.New()
	direct := newReplicaWith(t, db.DSN, advisory.Config{Logger: logger}, lease.Config{})
	slow := newReplicaWith(t, slowDSN, advisory.Config{}, lease.Config{Logger: logger})
	// The slow pool's connections are opened before the delay: a dial
	// through it (startup, auth, then the statement) would take some 4 s of
	// a statement's 5 s bound when the row try holds the first connection.
	var conns []*pgxpool.Conn
	for range 3 {
		c, err := slow.pool.Acquire(ctxT(t, 30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	p.SetLatency(oneWay)
	r := replica{pool: direct.pool, locker: direct.locker, store: slow.store}
	a := startCandidateTo(t, r, name, "a", func(c *leader.Config) {
		c.Logger, c.RetryInterval, c.TTL = logger, 50*time.Millisecond, 20*time.Second
	}, elected)

	start := time.Now()
	row := "pglocks.leader:" + name + "#c:a"
	conn := db.Conn(t)
	waitCut(t, "a's candidate row on the server", 2*time.Minute, func() bool {
		var n int
		err := conn.QueryRow(ctxT(t, 30*time.Second), "select count(*) from pglocks_leases where name = $1 and owner is not null", row).Scan(&n)
		return err == nil && n == 1
	})
	t.Logf("a's row on the server after %v", time.Since(start).Round(time.Millisecond))
	// The reply to a's try is oneWay away; a's Lock returns at once.
	if err := holder.e.Resign(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if ev := waitEvent(t, elected, "a's election"); ev.who != "a" {
		t.Fatalf("%s elected, want a", ev.who)
	}
	t.Logf("a elected after %v", time.Since(start).Round(time.Millisecond))
	p.SetLatency(0)
	waitCandidates(t, a.e, 2)
	t.Logf("both candidates listed after %v", time.Since(start).Round(time.Millisecond))
	for _, lease := range []string{row, "pglocks.leader:" + name} {
		for _, r := range warnings(rec, lease) {
			t.Errorf("a logged at %v about %s: %v", r.Level, lease, r)
		}
	}
}
