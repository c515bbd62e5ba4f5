package lease_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/internal/logtest"
	"github.com/pglocks/pglocks/internal/quietloss"
	"github.com/pglocks/pglocks/lease"
)

// TestQuietLoss: a lease acquired with a context marked by
// internal/quietloss (package leader's candidate rows) that is broken is lost as
// any other — Lost, Context, Err, the Observer's End event — and its loss
// is logged at Debug, not Warn; a lease without it still warns.
func TestQuietLoss(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec, log := logtest.New()
	ends := make(chan pglocks.EndEvent, 10)
	s := newStore(t, b.pool, lease.Config{Logger: log, Observer: &pglocks.Observer{End: func(e pglocks.EndEvent) { ends <- e }}})
	quiet, err := s.TryAcquire(quietloss.With(ctxT(t)), "quiet-loss", time.Minute, lease.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	loud := mustTry(t, s, "loud-loss", time.Minute, lease.WithKeepAlive())
	for _, l := range []*lease.Lease{quiet, loud} {
		if _, err := b.store.Break(ctxT(t), l.Name()); err != nil {
			t.Fatal(err)
		}
		select {
		case <-l.Lost():
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: not lost 30s after its Break", l.Name())
		}
		if !errors.Is(l.Err(), lease.ErrLost) {
			t.Errorf("%s: Err = %v, want ErrLost", l.Name(), l.Err())
		}
		select {
		case e := <-ends:
			if e.Name != l.Name() || e.Reason != pglocks.ReasonNotHeld {
				t.Errorf("End event %+v, want %s not held", e, l.Name())
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no End event", l.Name())
		}
	}
	levels := map[string]slog.Level{}
	for _, r := range rec.Records() {
		if r.Msg == "lease: not_held" {
			levels[r.Attrs["lease"]] = r.Level
		}
	}
	if lv, ok := levels["quiet-loss"]; !ok || lv != slog.LevelDebug {
		t.Errorf("quiet-loss's loss logged at %v (found %v), want Debug", lv, ok)
	}
	if lv, ok := levels["loud-loss"]; !ok || lv != slog.LevelWarn {
		t.Errorf("loud-loss's loss logged at %v (found %v), want Warn", lv, ok)
	}
}

// TestLossIsNoFailedRenewal: a kept-alive lease whose row another process
// changed, with no NOTIFY, is found not held by its next renewal (checks
// in between are turned off): that is
// its loss, logged as such at Warn, and no failed renewal — no "renew
// failed" Warn, and no "renew succeeded again" after the next renewal.
// And a TryAcquire its caller cancelled is no failed acquire.
func TestLossIsNoFailedRenewal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec, log := logtest.New()
	s := newStore(t, b.pool, lease.Config{Logger: log, CheckInterval: time.Minute})
	gone := mustTry(t, s, "taken-silently", 3*time.Second, lease.WithKeepAlive())
	mustTry(t, s, "still-held", 3*time.Second, lease.WithKeepAlive())
	if _, err := b.pool.Exec(ctxT(t), `update pglocks_leases set owner = gen_random_uuid(), token = token + 1 where name = $1`, gone.Name()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gone.Lost():
	case <-time.After(30 * time.Second):
		t.Fatal("not lost 30s after its row was taken")
	}
	// The other lease renews at least once more (every second).
	seen := len(rec.Records())
	renewed := func() bool {
		return slices.ContainsFunc(rec.Records()[seen:], func(r logtest.Record) bool { return r.Msg == "lease: renewed" })
	}
	for deadline := time.Now().Add(30 * time.Second); !renewed(); {
		if time.Now().After(deadline) {
			t.Fatal("no renewal within 30s after the loss")
		}
		<-time.After(20 * time.Millisecond)
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	cancel()
	if _, err := s.TryAcquire(ctx, "cancelled", time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("TryAcquire with a cancelled ctx = %v, want context.Canceled", err)
	}
	mustTry(t, s, "after-cancel", time.Minute)
	lost := false
	for _, r := range rec.Records() {
		switch {
		case r.Level >= slog.LevelWarn && r.Msg == "lease: not_held" && r.Attrs["lease"] == gone.Name():
			lost = true
		case r.Level >= slog.LevelWarn:
			t.Errorf("Warn: %v", r)
		}
	}
	if !lost {
		t.Error("no Warn for the lost lease")
	}
}
