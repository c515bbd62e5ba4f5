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
)

// TestOperatorBreakOfCandidateRowWarns: an operator breaks a follower's
// candidate row (pglocks break), and the follower is stopped as soon as
// its Store has seen the loss, before its next campaign step. The loss is
// no request's: it is logged at Warn (the Store logs a candidate row's
// loss at Debug, and the elector must say it). Failed when
// lease.WithQuietLoss made the Store quiet about every loss of the row
// and only the next campaign step warned.
func TestOperatorBreakOfCandidateRowWarns(t *testing.T) {
	t.Parallel()
	db := setup(t)
	elected := make(chan event, 100)
	recs := map[string]*logtest.Recorder{}
	cs := map[string]*candidate{}
	for _, id := range []string{"a", "b"} {
		rec, logger := logtest.New()
		r := newReplicaWith(t, db.DSN, advisory.Config{Logger: logger}, lease.Config{Logger: logger})
		recs[id] = rec
		cs[id] = startCandidateTo(t, r, "revq", id, func(c *leader.Config) {
			c.Logger = logger
			c.RetryInterval = 20 * time.Second
		}, elected)
	}
	first := waitEvent(t, elected, "first election")
	waitCandidates(t, cs[first.who].e, 2)
	fol := map[string]string{"a": "b", "b": "a"}[first.who]
	row := "pglocks.leader:revq#c:" + fol
	if _, err := newReplica(t, db.DSN).store.Break(ctxT(t, 30*time.Second), row); err != nil {
		t.Fatal(err)
	}
	// The Store's loss record, at whatever level it logs it.
	_, okD := recs[fol].Wait(slog.LevelDebug, "lease: not_held", 15*time.Second)
	_, okW := recs[fol].Wait(slog.LevelWarn, "lease: not_held", time.Millisecond)
	if !okD && !okW {
		t.Fatal("the follower's store never saw its row lost")
	}
	cs[fol].stop(t)
	for _, r := range recs[fol].Records() {
		if r.Level >= slog.LevelWarn && (strings.Contains(r.Msg, "lost") || r.Attrs["lease"] == row || r.Attrs["row"] == row) {
			t.Logf("warned: %v", r)
			return
		}
	}
	for _, r := range recs[fol].Records() {
		if r.Attrs["lease"] == row || r.Attrs["row"] == row {
			t.Logf("REC %v %s %v", r.Level, r.Msg, r.Attrs["err"])
		}
	}
	t.Errorf("candidate row %s broken by an operator: its loss was logged at no level above Debug", row)
}
