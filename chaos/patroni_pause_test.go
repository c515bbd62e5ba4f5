package chaos

import (
	"os"
	"testing"
	"time"

	"github.com/pglocks/pglocks/pgtest"
)

// TestPatroniChaosPause shows, apart from TestPatroniChaos, what a primary
// paused past the leader key's TTL does to the lease workload with
// Debian's Patroni 3.0.2 (docs/compatibility.md, "A paused primary"): on a
// cluster of its own (synchronous mode), pgtest.FaultPauseLong once — the
// primary's PostgreSQL stopped until the other node accepts writes and
// 10 s more, then continued — and the run goes on 15 s after it, with no
// recovery (the old primary's Patroni takes the leader key back, and the
// cluster never names a synchronous standby again). No other fault, so
// that what the oracles report is the pause's doing. It logs the report
// and fails only if the run could not be made: the violations are
// Patroni's (acknowledged commits of the promoted node discarded), which
// is why TestPatroniChaos leaves the pause out. Opt-in: PGLOCKS_PATRONI=1
// CHAOS_PATRONI_PAUSE=1.
func TestPatroniChaosPause(t *testing.T) {
	patroniOptIn(t)
	if os.Getenv("CHAOS_PATRONI_PAUSE") != "1" {
		t.Skip("opt-in: CHAOS_PATRONI_PAUSE=1 (documents Patroni 3.0.2's split brain after a pause)")
	}
	p := pgtest.NewPatroni(t, pgtest.PatroniOptions{})
	r := run(t, "lease", runOpts{patroni: p, brokenFor: 15 * time.Second,
		faults: []string{string(pgtest.FaultPauseLong)}})
	if len(r.failovers) != 1 {
		t.Fatalf("the pause was not injected:\n%s", r)
	}
	t.Logf("a paused primary under Patroni 3.0.2: %d violation(s) reported (Patroni's, not pglocks'; see docs/compatibility.md)", len(r.violations))
}
