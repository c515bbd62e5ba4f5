package advisory_test

import (
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/internal/logtest"
)

// TestLogs checks the Logger: acquisitions and busy keys at Debug, a lost
// lock at Warn, each with the key and the session's pid.
func TestLogs(t *testing.T) {
	t.Parallel()
	rec, log := logtest.New()
	b := setup(t, advisory.Config{Logger: log})
	other := newLocker(t, b.pool, advisory.Config{})
	ctx := ctxT(t)
	key := pglocks.KeyOf("log-key")
	lk, err := b.locker.TryLock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	r, ok := rec.Wait(slog.LevelDebug, "advisory: acquired", time.Second)
	if !ok || r.Attrs["key"] != key.String() || r.Attrs["pid"] != strconv.Itoa(int(lk.PID())) {
		t.Fatalf("acquired record = %v (found %v), want key %s and pid %d", r, ok, key, lk.PID())
	}
	lk2, err := other.TryLock(ctx, pglocks.KeyOf("log-other"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.locker.TryLock(ctx, pglocks.KeyOf("log-other")); err == nil {
		t.Fatal("TryLock of a held key succeeded")
	}
	if r, ok := rec.Wait(slog.LevelDebug, "advisory: busy", time.Second); !ok || r.Attrs["key"] != pglocks.KeyOf("log-other").String() {
		t.Fatalf("busy record = %v (found %v)", r, ok)
	}
	_ = lk2.Unlock(ctx)
	if err := b.db.Server.TerminateBackend(ctx, lk.PID()); err != nil {
		t.Fatal(err)
	}
	r, ok = rec.Wait(slog.LevelWarn, "advisory: session_died", 10*time.Second)
	if !ok || r.Attrs["key"] != key.String() || r.Attrs["err"] == "" || r.Attrs["held"] == "" {
		t.Fatalf("loss record = %v (found %v), want a Warn with key, held and err", r, ok)
	}
	for _, x := range rec.Records() {
		if x.Level >= slog.LevelWarn && x.Msg != "advisory: session_died" {
			t.Errorf("unexpected record at Warn or above: %v", x)
		}
	}
}
