package leader_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/internal/logtest"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// loggedCandidate is a candidate whose Elector and Store log to one
// recorder, as a program that gives its one logger to both.
type loggedCandidate struct {
	*candidate
	rec *logtest.Recorder
}

// loggedPair starts candidates a and b of election name, each logging to
// its own recorder, and returns them once one leads and both are listed,
// with the first leader and the database.
func loggedPair(t *testing.T, name string) (map[string]loggedCandidate, event, *pgtest.DB) {
	t.Helper()
	db := setup(t)
	elected := make(chan event, 100)
	cs := map[string]loggedCandidate{}
	for _, id := range []string{"a", "b"} {
		rec, logger := logtest.New()
		r := newReplicaWith(t, db.DSN, advisory.Config{Logger: logger}, lease.Config{Logger: logger})
		c := startCandidateTo(t, r, name, id, func(c *leader.Config) { c.Logger = logger }, elected)
		cs[id] = loggedCandidate{c, rec}
	}
	first := waitEvent(t, elected, "first election")
	waitCandidates(t, cs[first.who].e, 2)
	return cs, first, db
}

// warnings returns the records at Warn and above about the lease row
// (attribute lease or row).
func warnings(rec *logtest.Recorder, row string) []logtest.Record {
	var out []logtest.Record
	for _, r := range rec.Records() {
		if r.Level >= slog.LevelWarn && (r.Attrs["lease"] == row || r.Attrs["row"] == row) {
			out = append(out, r)
		}
	}
	return out
}

// TestRequestLogsNoWarning: a leader asked to resign or hand over from
// another process (pglocks leader resign|handover) logs the request at
// Info, naming it, and nothing at Warn: not the break of its candidate
// row, which is how the request wakes it, nor the retake of that row.
func TestRequestLogsNoWarning(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, info string
		ask        func(t *testing.T, store *lease.Store, election string) (leader.Leader, error)
	}{
		{"HandOver", "leader: handing over on request", func(t *testing.T, store *lease.Store, election string) (leader.Leader, error) {
			return leader.RequestHandOver(ctxT(t, 30*time.Second), store, election, "")
		}},
		{"Resign", "leader: resigning on request", func(t *testing.T, store *lease.Store, election string) (leader.Leader, error) {
			return leader.RequestResign(ctxT(t, 30*time.Second), store, election)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cs, first, db := loggedPair(t, "quiet")
			old := cs[first.who]
			l, err := tc.ask(t, newReplica(t, db.DSN).store, "quiet")
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("term %d (%s) → %d (%s)", first.term.Number, first.who, l.Term, l.Identity)
			waitEvent(t, old.demoted, "the old leader's demotion")
			// The old leader is a candidate again: its row, broken by the
			// request, is taken again.
			waitCandidates(t, old.e, 2)
			if _, ok := old.rec.Wait(slog.LevelInfo, tc.info, 30*time.Second); !ok {
				t.Errorf("no Info %q from the old leader", tc.info)
			}
			// Only its candidate row's: a loaded machine may delay a
			// renewal, which is worth a Warn.
			for _, r := range warnings(old.rec, "pglocks.leader:quiet#c:"+first.who) {
				t.Errorf("the old leader logged at %v about its candidate row after a request: %v", r.Level, r)
			}
			if t.Failed() {
				for _, r := range old.rec.Records() {
					t.Logf("DUMP %v", r)
				}
			}
		})
	}
}

// TestLostCandidateRowWarns: a candidate row lost for another reason than
// a request — broken by an operator, deleted by hand — is still logged at
// Warn by the elector, naming the row, by the leader and by a follower,
// and taken again.
func TestLostCandidateRowWarns(t *testing.T) {
	t.Parallel()
	cs, first, db := loggedPair(t, "lostrow")
	follower := cs[map[string]string{"a": "b", "b": "a"}[first.who]]
	leaderRow := "pglocks.leader:lostrow#c:" + first.who
	if _, err := newReplica(t, db.DSN).store.Break(ctxT(t, 30*time.Second), leaderRow); err != nil {
		t.Fatal(err)
	}
	conn := db.Conn(t)
	followerRow := "pglocks.leader:lostrow#c:" + follower.identity
	if _, err := conn.Exec(ctxT(t, 30*time.Second), "delete from pglocks_leases where name = $1", followerRow); err != nil {
		t.Fatal(err)
	}
	for _, c := range []loggedCandidate{cs[first.who], follower} {
		row := "pglocks.leader:lostrow#c:" + c.identity
		waitCut(t, "a Warn that "+row+" was lost", 30*time.Second, func() bool {
			for _, r := range warnings(c.rec, row) {
				if strings.Contains(r.Msg, "candidate row lost") {
					t.Logf("%s: %v", c.identity, r)
					return true
				}
			}
			return false
		})
	}
	waitCandidates(t, follower.e, 2)
}
