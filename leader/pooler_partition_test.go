package leader_test

import (
	"testing"
	"time"

	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// TestSessionPoolerPartitionedLeader: a session-mode leader whose
// connections all go through a session-mode PgBouncer is cut off from
// PgBouncer for real, while PgBouncer's link to the server stays healthy.
// It steps down; the server ends its lock session once the pings stop (the
// Locker's idle bound), so the other candidate — which is not allowed to
// terminate it (NoTerminate) — is elected within about the Locker's
// TCPUserTimeout plus Grace. Before, PgBouncer kept the session and the
// lock for hours and nobody was elected.
func TestSessionPoolerPartitionedLeader(t *testing.T) {
	t.Parallel()
	db := setup(t)
	bouncer, bdsn := db.Bouncer(t, pgtest.PoolSession)
	p := pgtest.NewProxy(t, bouncer.Addr(), pgtest.Partitionable())
	pdsn, err := pgtest.ViaProxy(bdsn, p)
	if err != nil {
		t.Fatal(err)
	}
	noTerminate := func(c *leader.Config) { c.Mode, c.NoTerminate, c.TTL = leader.ModeSession, true, 5*time.Second }
	elected := make(chan event, 100)
	a := startCandidateTo(t, newReplicaWith(t, pdsn, advisory.Config{}, lease.Config{}), "cut", "a", noTerminate, elected)
	first := waitEvent(t, elected, "a's election")
	b := startCandidateTo(t, newReplica(t, db.DSN), "cut", "b", noTerminate, elected)
	t.Cleanup(p.Pass) // before the candidates stop
	if err := p.Partition(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	d := waitEvent(t, a.demoted, "a's demotion")
	bound := advisory.DefaultTCPUserTimeout + b.e.Config().Grace + 20*time.Second
	select {
	case next := <-elected:
		if next.who != "b" || next.term.Number <= first.term.Number {
			t.Fatalf("elected %s in term %d after a's term %d", next.who, next.term.Number, first.term.Number)
		}
		if !d.at.Before(next.at) {
			t.Fatalf("b elected at %v, before a stepped down at %v", next.at, d.at)
		}
		t.Logf("a stepped down %v after the cut; b elected %v after it",
			d.at.Sub(start).Round(time.Millisecond), next.at.Sub(start).Round(time.Millisecond))
	case <-time.After(bound):
		t.Fatalf("no new leader %v after the leader was cut off from the session-mode PgBouncer (a stepped down after %v)",
			bound, d.at.Sub(start).Round(time.Millisecond))
	}
}
