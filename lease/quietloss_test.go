package lease_test

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/internal/logtest"
	"github.com/pglocks/pglocks/lease"
)

// TestQuietLoss: a lease acquired WithQuietLoss that is broken is lost as
// any other — Lost, Context, Err, the Observer's End event — and its loss
// is logged at Debug, not Warn; a lease without it still warns.
func TestQuietLoss(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec, log := logtest.New()
	ends := make(chan pglocks.EndEvent, 10)
	s := newStore(t, b.pool, lease.Config{Logger: log, Observer: &pglocks.Observer{End: func(e pglocks.EndEvent) { ends <- e }}})
	quiet := mustTry(t, s, "quiet-loss", time.Minute, lease.WithKeepAlive(), lease.WithQuietLoss())
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
