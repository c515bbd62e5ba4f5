package lease_test

import (
	"errors"
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

// TestInvalidInputStartsNoFailureRun: a semaphore try for more permits
// than the stored limit is the caller's error: it is logged at Debug, not
// as a failed acquire, and begins no run of failures, so the next
// acquisition (of another name) logs no Warn that acquires succeed again.
func TestInvalidInputStartsNoFailureRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec, log := logtest.New()
	s := newStore(t, b.pool, lease.Config{Logger: log})
	ctx := ctxT(t)
	sem, err := s.Semaphore("catalog", 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, wait := range []bool{false, true} {
		var err error
		if wait {
			_, err = sem.Acquire(ctx, 4, time.Minute)
		} else {
			_, err = sem.TryAcquire(ctx, 4, time.Minute)
		}
		if !errors.Is(err, lease.ErrInvalidPermits) {
			t.Fatalf("4 permits of 3 (wait %v): %v, want ErrInvalidPermits", wait, err)
		}
	}
	l := mustTry(t, s, "catalog-other", time.Minute)
	defer func() { _ = l.Release(ctx) }()
	if _, ok := rec.Wait(slog.LevelDebug, "lease: acquired", 10*time.Second); !ok {
		t.Fatal("no Debug record of the acquisition")
	}
	for _, r := range rec.Records() {
		if r.Level >= slog.LevelWarn {
			t.Errorf("record at %v: %v", r.Level, r)
		}
	}
}
