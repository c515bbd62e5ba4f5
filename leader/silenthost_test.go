package leader_test

import (
	"net/url"
	"testing"
	"time"
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
	u, err := url.Parse(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.Addr() + "," + u.Host
	q := u.Query()
	q.Set("connect_timeout", "2")
	q.Set("target_session_attrs", "read-write")
	u.RawQuery = q.Encode()
	elected := make(chan event, 100)
	start := time.Now()
	for _, id := range []string{"a", "b", "c"} {
		startCandidateTo(t, newReplica(t, u.String()), "silent-first-host", id, nil, elected)
	}
	ev := waitEvent(t, elected, "a leader behind a silent first host")
	t.Logf("%s elected in term %d after %v", ev.who, ev.term.Number, time.Since(start))
}
