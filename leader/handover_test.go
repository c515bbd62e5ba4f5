package leader_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
)

// trio starts three candidates of one election, each on connections of its
// own, with the value "addr-<identity>", and returns them once one leads.
func trio(t *testing.T, name string, tweak func(*leader.Config)) (map[string]*candidate, event, replica) {
	t.Helper()
	db := setup(t)
	elected := make(chan event, 100)
	cs := map[string]*candidate{}
	for _, id := range []string{"a", "b", "c"} {
		cs[id] = startCandidateTo(t, newReplica(t, db.DSN), name, id, func(c *leader.Config) {
			c.Value = "addr-" + c.Identity
			if tweak != nil {
				tweak(c)
			}
		}, elected)
	}
	first := waitEvent(t, elected, "first election")
	waitCandidates(t, cs[first.who].e, 3)
	return cs, first, newReplica(t, db.DSN)
}

// waitCandidates waits until e's election lists n candidates.
func waitCandidates(t *testing.T, e *leader.Elector, n int) []leader.Candidate {
	t.Helper()
	var (
		got []leader.Candidate
		err error
	)
	waitCut(t, "the candidates", 30*time.Second, func() bool {
		got, err = e.Candidates(ctxT(t, 30*time.Second))
		return err == nil && len(got) == n
	})
	return got
}

func other(first string, not ...string) string {
	for _, id := range []string{"a", "b", "c"} {
		if id != first && (len(not) == 0 || id != not[0]) {
			return id
		}
	}
	return ""
}

func TestCandidatesListed(t *testing.T) {
	t.Parallel()
	cs, first, _ := trio(t, "cands", nil)
	got := waitCandidates(t, cs[first.who].e, 3)
	leading := 0
	for _, c := range got {
		if c.Value != "addr-"+c.Identity || c.JoinedAt.IsZero() || c.LastSeen.Before(c.JoinedAt) || c.Election != "cands" {
			t.Errorf("candidate %+v", c)
		}
		if c.Leading {
			leading++
			if c.Identity != first.who {
				t.Errorf("leading %q, elected %q", c.Identity, first.who)
			}
		}
	}
	if leading != 1 {
		t.Errorf("%d leading, want 1", leading)
	}
	// A stopped candidate disappears at once (it releases its row).
	gone := other(first.who)
	cs[gone].stop(t)
	for _, c := range waitCandidates(t, cs[first.who].e, 2) {
		if c.Identity == gone {
			t.Errorf("stopped candidate %q still listed", gone)
		}
	}
}

func TestHandOverToNamed(t *testing.T) {
	t.Parallel()
	cs, first, _ := trio(t, "handover", nil)
	old := cs[first.who]
	to := other(first.who)
	ctx := ctxT(t, 30*time.Second)
	// Bad input: the leader keeps leading.
	for _, bad := range []string{"nobody", first.who} {
		if err := old.e.HandOver(ctx, bad); !errors.Is(err, leader.ErrNoCandidate) {
			t.Fatalf("HandOver(%q) = %v, want ErrNoCandidate", bad, err)
		}
	}
	if err := cs[to].e.HandOver(ctx, first.who); !errors.Is(err, leader.ErrNotLeader) {
		t.Fatalf("HandOver by a follower = %v, want ErrNotLeader", err)
	}
	if cur, ok := old.e.Current(); !ok || cur.Number != first.term.Number {
		t.Fatalf("after refused hand-overs: Current() = %v, %v", cur.Number, ok)
	}
	if err := old.e.HandOver(ctx, to); err != nil {
		t.Fatal(err)
	}
	d := waitEvent(t, old.demoted, "demotion")
	if !errors.Is(d.reason, leader.ErrHandedOver) || !errors.Is(d.reason, leader.ErrResigned) {
		t.Errorf("demoted with %v, want ErrHandedOver", d.reason)
	}
	next := waitEvent(t, old.elected, "next election")
	if next.who != to || next.term.Number <= first.term.Number {
		t.Fatalf("next term %d by %q, want > %d by %q", next.term.Number, next.who, first.term.Number, to)
	}
	if gap := next.at.Sub(d.at); gap > time.Second {
		t.Errorf("leaderless gap %v", gap)
	}
	// The old term is fenced.
	tx, err := cs[to].e.Config().Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := first.term.Guard(ctx, tx); !errors.Is(err, lease.ErrNotHeld) {
		t.Errorf("old term's Guard = %v, want ErrNotHeld", err)
	}
}

func TestRequestHandOverAndResign(t *testing.T) {
	t.Parallel()
	cs, first, outsider := trio(t, "request", nil)
	ctx := ctxT(t, 60*time.Second)
	if _, err := leader.RequestHandOver(ctx, outsider.store, "request", "nobody"); !errors.Is(err, leader.ErrNoCandidate) {
		t.Fatalf("RequestHandOver to nobody = %v", err)
	}
	if _, err := leader.RequestResign(ctx, outsider.store, "no-such-election"); !errors.Is(err, leader.ErrNoLeader) {
		t.Fatalf("RequestResign without a leader = %v", err)
	}
	to := other(first.who)
	l, err := leader.RequestHandOver(ctx, outsider.store, "request", to)
	if err != nil {
		t.Fatal(err)
	}
	if l.Identity != to || l.Term <= first.term.Number || l.Value != "addr-"+to {
		t.Fatalf("after hand-over: %+v", l)
	}
	next := waitEvent(t, cs[first.who].elected, "hand-over")
	if next.who != to {
		t.Fatalf("elected %q, want %q", next.who, to)
	}
	l2, err := leader.RequestResign(ctx, outsider.store, "request")
	if err != nil {
		t.Fatal(err)
	}
	if l2.Term <= l.Term {
		t.Fatalf("after resign: %+v", l2)
	}
	d := waitEvent(t, cs[to].demoted, "resignation")
	if !errors.Is(d.reason, leader.ErrResigned) || errors.Is(d.reason, leader.ErrHandedOver) {
		t.Errorf("demoted with %v", d.reason)
	}
}

func TestProclaimObserved(t *testing.T) {
	t.Parallel()
	cs, first, _ := trio(t, "proclaim", nil)
	ctx, cancel := context.WithCancel(ctxT(t, 60*time.Second))
	defer cancel()
	obs := cs[other(first.who)].e.Observe(ctx)
	waitValue := func(want string) leader.Leader {
		t.Helper()
		for {
			select {
			case l, ok := <-obs:
				if !ok {
					t.Fatalf("Observe closed before value %q", want)
				}
				if l.Held && l.Value == want {
					return l
				}
			case <-ctx.Done():
				t.Fatalf("no value %q observed", want)
			}
		}
	}
	waitValue("addr-" + first.who)
	if err := first.term.Proclaim(ctx, "moved"); err != nil {
		t.Fatal(err)
	}
	if l := waitValue("moved"); l.Term != first.term.Number {
		t.Errorf("value in term %d, want %d", l.Term, first.term.Number)
	}
	if first.term.Value() != "moved" {
		t.Errorf("Term.Value = %q", first.term.Value())
	}
	big := make([]byte, leader.MaxValueLen+1)
	for i := range big {
		big[i] = 'x'
	}
	if err := first.term.Proclaim(ctx, string(big)); err == nil {
		t.Error("Proclaim of MaxValueLen+1 bytes: no error")
	}
	if err := (leader.Term{}).Proclaim(ctx, "x"); !errors.Is(err, lease.ErrNotHeld) {
		t.Errorf("zero Term's Proclaim = %v", err)
	}
}
