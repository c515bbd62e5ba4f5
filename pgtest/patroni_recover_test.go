package pgtest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pglocks/pglocks/internal/patronienv"
)

// TestPatroniRecoverSettles plays faults on a synchronous and an
// asynchronous cluster and checks, the moment Failover.Recover returns,
// what the next fault relies on, by the truth rather than by any node's
// REST API: every replica's own walreceiver streams on the primary's
// timeline; in synchronous mode the sync key in etcd names the primary
// its leader and a standby that the primary's pg_stat_replication shows
// streaming with sync_state 'sync'. And for 10 s after, no replica's
// postmaster is replaced: a rewind (pg_rewind restarts it) or a rejoin
// that Recover did not wait for would. Opt-in: PGLOCKS_PATRONI=1;
// PGLOCKS_PATRONI_RUNS runs per fault (2).
func TestPatroniRecoverSettles(t *testing.T) {
	runs := patronienv.Runs(t, 2)
	for _, async := range []bool{false, true} {
		t.Run(fmt.Sprint("async=", async), func(t *testing.T) {
			p := NewPatroni(t, PatroniOptions{Async: async})
			for _, f := range []PatroniFault{FaultKillPostmaster, FaultKillNode, FaultPartition} {
				if !p.Supports(f) {
					continue
				}
				for i := range runs {
					recoverAndCheck(t, p, f, i)
				}
			}
		})
	}
}

// recoverAndCheck plays f, recovers, and checks the cluster as Recover
// left it (see TestPatroniRecoverSettles).
func recoverAndCheck(t *testing.T, p *Patroni, f PatroniFault, i int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	fo, err := p.Fault(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if err := fo.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	primary := p.Primary(ctx)
	st, err := p.readPrimary(ctx, primary)
	if err != nil {
		t.Fatalf("%s %d: read the primary %s: %v", f, i, primary, err)
	}
	pids := map[string]int{}
	for _, n := range p.nodes {
		if n.name == primary {
			continue
		}
		pids[n.name] = n.postmasterPID()
		if !p.caughtUp(ctx, n.name, primaryState{timeline: st.timeline, flushLSN: "0/0"}) {
			t.Errorf("%s %d: Recover returned while %s streams from nowhere or off the primary %s's timeline %d",
				f, i, n.name, primary, st.timeline)
		}
	}
	if !p.opts.Async {
		leader, standbys, err := p.syncStandbys(ctx)
		if err != nil || leader != primary || !slices.ContainsFunc(standbys, func(s string) bool { return st.standby[s] == "sync" }) {
			t.Errorf("%s %d: Recover returned without a synchronous standby: sync key leader %q standbys %v (%v); the primary %s streams to %v",
				f, i, leader, standbys, err, primary, st.standby)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) { // a window to see restarts in, not a synchronization
		for _, n := range p.nodes {
			if pid, ok := pids[n.name]; ok && n.postmasterPID() != pid {
				t.Errorf("%s %d: %s's postmaster was replaced (pid %d → %d) after Recover returned", f, i, n.name, pid, n.postmasterPID())
				delete(pids, n.name)
			}
		}
		time.Sleep(100 * time.Millisecond) // polls pid files of processes not ours
	}
	t.Logf("%s %d: %s → %s writable after %v; recovered, primary %s", f, i, fo.Old, fo.New, fo.Writable.Round(time.Millisecond), primary)
}
