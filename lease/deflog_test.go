package lease_test

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/pglocks/pglocks/internal/logtest"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// TestDefaultLoggerWarns: a Store made without Config.Logger reports its
// warnings — a lost lease, an acquire that fails (no table) — to
// slog.Default(), and nothing below Warn (acquired and busy leases are
// Debug). Not parallel: it sets the process's default logger.
func TestDefaultLoggerWarns(t *testing.T) {
	rec := logtest.SetDefault(t)
	b := setup(t)
	ctx := ctxT(t)
	l := mustTry(t, b.store, "default-log", time.Minute)
	if _, err := b.store.TryAcquire(ctx, "default-log", time.Minute); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("second TryAcquire = %v, want ErrHeld", err)
	}
	if _, err := newStore(t, b.pool, lease.Config{}).Break(ctx, "default-log"); err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Renew after Break = %v, want ErrNotHeld", err)
	}
	if _, ok := rec.Wait(slog.LevelWarn, "lease: not_held", 10*time.Second); !ok {
		t.Errorf("no Warn of the lost lease reached slog.Default(); records: %v", rec.Records())
	}
	empty := pgtest.New(t)
	pool := empty.NewPool(t)
	exec(t, pool, "drop table pglocks_leases")
	if _, err := newStore(t, pool, lease.Config{}).TryAcquire(ctx, "default-log", time.Minute); !errors.Is(err, lease.ErrNoTable) {
		t.Fatalf("TryAcquire without the table = %v, want ErrNoTable", err)
	}
	if _, ok := rec.Wait(slog.LevelWarn, "lease: acquire failed", 10*time.Second); !ok {
		t.Errorf("no Warn of the failed acquire reached slog.Default(); records: %v", rec.Records())
	}
	if below := rec.Below(slog.LevelWarn, "lease:"); len(below) > 0 {
		t.Errorf("records below Warn reached slog.Default(): %v", below)
	}
}
