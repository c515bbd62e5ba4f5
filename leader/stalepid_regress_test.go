package leader_test

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/internal/logtest"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
)

// TestStaleTermOfNoSession: an expired term whose recorded session holds
// no lock of the election on this server — it ended, or it was a backend
// of the primary before a failover — is nobody's to terminate. The
// candidates said it "still holds the lock, with other locks or none of
// ours" at Warn and reported ErrStaleLeader in State, after every Patroni
// failover: misleading, and gating nothing, since the session holding the
// lock then is a candidate that outwaits the term. Here another session
// holds the lock (so the campaign waits and reads the row): nothing is
// reported while a candidate could still be outwaiting the term, and once
// that time has passed the holder is reported, by its pid, at Warn and in
// State, once.
func TestStaleTermOfNoSession(t *testing.T) {
	t.Parallel()
	db := setup(t)
	const name = "stalepid"
	elected := make(chan event, 10)
	old := startCandidateTo(t, newReplica(t, db.DSN), name, "old", nil, elected)
	first := waitEvent(t, elected, "the first election")
	conn := db.Conn(t)
	ctx := ctxT(t, 2*time.Minute)
	var md []byte
	if err := conn.QueryRow(ctx, "select metadata from pglocks_leases where name = $1", "pglocks.leader:"+name).Scan(&md); err != nil {
		t.Fatal(err)
	}
	key := old.e.Key()
	old.stop(t)
	// Another session holds the election's lock; the row shows the old
	// term, expired, unreleased, naming the old leader's session, which
	// holds no lock now.
	other := newReplica(t, db.DSN)
	lk, err := other.locker.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `update pglocks_leases set owner = gen_random_uuid(), metadata = $2,
		expires_at = clock_timestamp() - interval '1 second' where name = $1 and token = $3`,
		"pglocks.leader:"+name, md, first.term.Number); err != nil {
		t.Fatal(err)
	}

	rec, logger := logtest.New()
	r := newReplicaWith(t, db.DSN, advisory.Config{}, lease.Config{})
	b := startCandidateTo(t, r, name, "b", func(c *leader.Config) {
		c.Logger, c.RetryInterval = logger, 50*time.Millisecond
	}, elected)
	if _, ok := rec.Wait(slog.LevelDebug, "leader: the election's lock is held by a session the expired term does not name; waiting", time.Minute); !ok {
		t.Fatal("b did not judge the stale term")
	}
	for _, r := range rec.Records() {
		if r.Level >= slog.LevelWarn {
			t.Errorf("b logged at %v before a candidate could have outwaited the term: %v", r.Level, r)
		}
	}
	if st := b.e.State(); errors.Is(st.LastError, leader.ErrStaleLeader) {
		t.Errorf("b's State().LastError = %v before a candidate could have outwaited the term", st.LastError)
	}
	w, ok := rec.Wait(slog.LevelWarn, "leader: the election's lock is held by a session no term names; waiting for it to let go", time.Minute)
	if !ok {
		t.Fatal("b did not report the session that holds the lock")
	}
	// The bound: the old term's TTL (3 s) + 5 s, three times, and more.
	if waited, err := time.ParseDuration(w.Attrs["waited"]); err != nil || waited < 20*time.Second {
		t.Errorf("reported after %v, want after the time a candidate needs to outwait and break the term (over 20 s here)", w.Attrs["waited"])
	}
	if got := fmt.Sprint(w.Attrs["holder_pid"]); got != fmt.Sprint(lk.PID()) {
		t.Errorf("reported holder pid %s, want the lock's session %d", got, lk.PID())
	}
	if st := b.e.State(); !errors.Is(st.LastError, leader.ErrStaleLeader) {
		t.Errorf("b's State().LastError = %v, want ErrStaleLeader", st.LastError)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := waitEvent(t, elected, "b's election"); ev.who != "b" || ev.term.Number <= first.term.Number {
		t.Fatalf("%s elected in term %d after term %d, want b in a later one", ev.who, ev.term.Number, first.term.Number)
	}
	n := 0
	for _, r := range rec.Records() {
		if r.Level >= slog.LevelWarn && strings.Contains(r.Msg, "no term names") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("the holder was reported %d times, want once", n)
	}
}
