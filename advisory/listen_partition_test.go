package advisory_test

import (
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
)

// TestPartitionedListenerEnds: the Locker's LISTEN connection
// holds no lock, but behind a session-mode PgBouncer a client cut off from
// the network leaves it on the server — and in PgBouncer's pool — as long
// as PgBouncer keeps the dead client (hours). It sets idle_session_timeout
// = TCPUserTimeout and sends a round trip every TCPUserTimeout/2 whatever
// arrives, so the server ends it once the client is gone, as it ends the
// lock sessions.
func TestPartitionedListenerEnds(t *testing.T) {
	t.Parallel()
	b, p, pool := pooledPath(t, true)
	defer p.Pass()
	cfg := advisory.Config{
		ApplicationName:    b.app + "-cut-listener",
		MaxSessions:        1,
		QueryTimeout:       time.Second,
		KeepalivesIdle:     time.Second,
		KeepalivesInterval: time.Second,
		KeepalivesCount:    2,
		TCPUserTimeout:     3 * time.Second,
	}
	l := newLocker(t, pool, cfg)
	ctx := ctxT(t)
	lk, err := l.Lock(ctx, pglocks.KeyOf("cut-listener"))
	if err != nil {
		t.Fatal(err)
	}
	listener := listenerPID(t, ctx, b, cfg.ApplicationName, lk.PID())
	if err := p.Partition(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	bound := cfg.TCPUserTimeout + 15*time.Second // generous slack for a loaded machine
	waitFor(t, "the partitioned Locker's LISTEN backend to end", bound, func() bool {
		var n int
		if err := b.pool.QueryRow(ctx, "select count(*) from pg_stat_activity where pid = $1", listener).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	t.Logf("the LISTEN backend (pid %d) ended %v after the cut (TCPUserTimeout %v)",
		listener, time.Since(start).Round(time.Millisecond), cfg.TCPUserTimeout)
}
