package lease_test

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglocks/pglocks/internal/logtest"
	"github.com/pglocks/pglocks/lease"
)

// TestFailingAcquiresWarnOnce: TryAcquire called in a loop by 8
// goroutines on a store that fails every call (the lease table is
// missing) logs one Warn, with the cause, and the other failures at
// Debug; the first acquisition once the table exists logs one Warn that
// acquires succeed again, with the number of failures. Before, every
// failed call logged a Warn (on stderr by default).
func TestFailingAcquiresWarnOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	exec(t, b.pool, "drop table pglocks_leases")
	rec, log := logtest.New()
	s := newStore(t, b.pool, lease.Config{Logger: log})
	ctx := ctxT(t)
	var failed atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(time.Second)
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(end) {
				if _, err := s.TryAcquire(ctx, "logrun", time.Minute); err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	warns := func() (out []logtest.Record) {
		for _, r := range rec.Records() {
			if r.Level >= slog.LevelWarn {
				out = append(out, r)
			}
		}
		return out
	}
	w := warns()
	t.Logf("%d acquires failed; %d records at Warn or above: %v", failed.Load(), len(w), w[:min(len(w), 3)])
	if failed.Load() < 10 {
		t.Fatalf("only %d acquires failed: the storm did not happen", failed.Load())
	}
	if len(w) != 1 || w[0].Attrs["err"] == "" {
		t.Errorf("%d records at Warn or above, want 1 with the cause", len(w))
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	l := mustTry(t, s, "logrun", time.Minute)
	defer func() { _ = l.Release(ctx) }()
	r, ok := rec.Wait(slog.LevelWarn, "again", 10*time.Second)
	if !ok || r.Attrs["failures"] == "" {
		t.Fatalf("no Warn that acquires succeed again, with the number of failures; %d records at Warn", len(warns()))
	}
	if w := warns(); len(w) != 2 {
		t.Errorf("%d records at Warn or above, want 2", len(w))
	}
}
