package lease_test

import (
	"errors"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/pglocks/pglocks/internal/logtest"
	"github.com/pglocks/pglocks/lease"
)

// TestLogs checks the Logger: acquisitions, busy leases and releases at
// Debug, a lost lease at Warn, with the lease's name, owner and token.
func TestLogs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec, log := logtest.New()
	s := newStore(t, b.pool, lease.Config{Logger: log})
	ctx := ctxT(t)
	l := mustTry(t, s, "log-lease", time.Minute)
	r, ok := rec.Wait(slog.LevelDebug, "lease: acquired", time.Second)
	if !ok || r.Attrs["lease"] != "log-lease" || r.Attrs["token"] != strconv.FormatInt(l.Token(), 10) || r.Attrs["owner"] != l.Owner().String() {
		t.Fatalf("acquired record = %v (found %v)", r, ok)
	}
	if _, err := s.TryAcquire(ctx, "log-lease", time.Minute); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("second TryAcquire = %v, want ErrHeld", err)
	}
	if _, ok := rec.Wait(slog.LevelDebug, "lease: busy", time.Second); !ok {
		t.Fatal("no busy record")
	}
	if _, err := b.store.Break(ctx, "log-lease"); err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Renew after Break = %v, want ErrNotHeld", err)
	}
	r, ok = rec.Wait(slog.LevelWarn, "lease: not_held", 10*time.Second)
	if !ok || r.Attrs["lease"] != "log-lease" || r.Attrs["err"] == "" {
		t.Fatalf("loss record = %v (found %v), want a Warn with lease and err", r, ok)
	}
	l2 := mustTry(t, s, "log-released", time.Minute)
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r, ok := rec.Wait(slog.LevelDebug, "lease: released", time.Second); !ok || r.Attrs["lease"] != "log-released" {
		t.Fatalf("released record = %v (found %v)", r, ok)
	}
}
