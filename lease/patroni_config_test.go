package lease_test

import (
	"github.com/pglocks/pglocks/pgtest"
)

// patroniFaults run one after another on one cluster, which recovers
// (a synchronous standby again) between them. A pause is run on a cluster
// of its own each time: with Debian's Patroni (3.0.2) the paused
// primary's Patroni takes the leader key back when it resumes, and the
// cluster never names a synchronous standby again.
var patroniFaults = []pgtest.PatroniFault{
	pgtest.FaultSwitchover, pgtest.FaultKillPostmaster, pgtest.FaultKillNode, pgtest.FaultPartition,
}
