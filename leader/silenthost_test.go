package leader_test

import (
	"testing"
	"time"

	"github.com/pglocks/pglocks/internal/routetest"
)

// TestSilentFirstHost: candidates whose DSN lists first a host that
// accepts connections and never answers (a blackholed proxy, as a
// partitioned old primary listed before the new one) elect a leader: each
// new connection costs that host's connect_timeout (2 s), and the
// advisory engine probe's second connection goes to the server the first
// reached rather than to the silent host again. Before, every session dial
// ran out of time in the probe, and no candidate was ever elected.
func TestSilentFirstHost(t *testing.T) {
	t.Parallel()
	db := setup(t)
	p, _ := db.Proxy(t)
	p.Blackhole()
	dsn := routetest.FirstHost(t, db.DSN, p.Addr(), map[string]string{"connect_timeout": "2", "target_session_attrs": "read-write"})
	elected := make(chan event, 100)
	start := time.Now()
	for _, id := range []string{"a", "b", "c"} {
		startCandidateTo(t, newReplica(t, dsn), "silent-first-host", id, nil, elected)
	}
	ev := waitEvent(t, elected, "a leader behind a silent first host")
	t.Logf("%s elected in term %d after %v", ev.who, ev.term.Number, time.Since(start))
}
