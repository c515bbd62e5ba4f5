package advisory_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/internal/logtest"
)

// TestDefaultLoggerWarns: a Locker made without Config.Logger reports its
// warnings — a try that cannot reach the server, a lost lock — to
// slog.Default(), and nothing below Warn (a lock taken is Debug). Not
// parallel: it sets the process's default logger.
func TestDefaultLoggerWarns(t *testing.T) {
	rec := logtest.SetDefault(t)
	b := setup(t)
	ctx := ctxT(t)
	if _, err := b.locker.TryLock(ctx, pglocks.KeyOf("default-log")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.TerminateApplication(ctx, b.app); err != nil {
		t.Fatal(err)
	}
	if _, ok := rec.Wait(slog.LevelWarn, "advisory: session_died", 30*time.Second); !ok {
		t.Errorf("no Warn of the lost lock reached slog.Default(); records: %v", rec.Records())
	}
	down := newLocker(t, lazyPool(t, "postgres://postgres@"+closedAddr(t)+"/x?sslmode=disable"), advisory.Config{})
	if _, err := down.TryLock(ctx, pglocks.KeyOf("default-log")); err == nil {
		t.Fatal("TryLock on a closed port succeeded")
	}
	if _, ok := rec.Wait(slog.LevelWarn, "advisory: acquire failed", 10*time.Second); !ok {
		t.Errorf("no Warn of the failed try reached slog.Default(); records: %v", rec.Records())
	}
	if below := rec.Below(slog.LevelWarn, "advisory:"); len(below) > 0 {
		t.Errorf("records below Warn reached slog.Default(): %v", below)
	}
}
