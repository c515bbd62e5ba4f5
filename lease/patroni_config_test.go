package lease_test

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pglocks/pglocks/pgtest"
)

// patroniRuns is how many faults of each kind a Patroni test injects:
// PGLOCKS_PATRONI_RUNS, 1 if unset. The tests are opt-in
// (PGLOCKS_PATRONI=1): a cluster starts in some 30 s and a dead primary is
// replaced after the leader key's TTL (20 s).
func patroniRuns(t *testing.T) int {
	t.Helper()
	if os.Getenv("PGLOCKS_PATRONI") != "1" {
		t.Skip("Patroni tests are opt-in: set PGLOCKS_PATRONI=1")
	}
	n, err := strconv.Atoi(os.Getenv("PGLOCKS_PATRONI_RUNS"))
	if err != nil || n <= 0 {
		return 1
	}
	return n
}

// patroniFaults run one after another on one cluster, which recovers
// (a synchronous standby again) between them. A pause is run on a cluster
// of its own each time: with Debian's Patroni (3.0.2) the paused
// primary's Patroni takes the leader key back when it resumes, and the
// cluster never names a synchronous standby again.
var patroniFaults = []pgtest.PatroniFault{
	pgtest.FaultSwitchover, pgtest.FaultKillPostmaster, pgtest.FaultKillNode, pgtest.FaultPartition,
}

// faultsWanted returns faults, or those named in PGLOCKS_PATRONI_FAULTS
// (a comma-separated list, e.g. "pause" or "switchover,kill-node").
func faultsWanted(faults []pgtest.PatroniFault) []pgtest.PatroniFault {
	want := os.Getenv("PGLOCKS_PATRONI_FAULTS")
	if want == "" {
		return faults
	}
	var out []pgtest.PatroniFault
	for _, f := range faults {
		if slices.Contains(strings.Split(want, ","), string(f)) {
			out = append(out, f)
		}
	}
	return out
}
