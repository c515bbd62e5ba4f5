package advisory_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/internal/logtest"
)

// TestOutageWarnsOnce: tries failing by the thousand during an outage (the
// role at connection limit 0: every dial is refused with 53300) log one
// Warn, with the cause, and the others at Debug; the first acquire that
// succeeds once the role may connect again logs one Warn that says so,
// with the number of failures. Before, every failed call logged a Warn:
// thousands a second on stderr by default.
func TestOutageWarnsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	role := createRole(t, b.db)
	admin := b.db.Conn(t)
	ctx := ctxT(t)
	limit := func(n string) {
		if _, err := admin.Exec(ctx, "alter role "+pgx.Identifier{role}.Sanitize()+" connection limit "+n); err != nil {
			t.Fatal(err)
		}
	}
	limit("0")
	rec, log := logtest.New()
	l := newLocker(t, lazyPool(t, withUser(t, b.db.DSN, role, "right")), advisory.Config{Logger: log})
	st := hammer(t, l, 8, time.Second)
	warns := func() (out []logtest.Record) {
		for _, r := range rec.Records() {
			if r.Level >= slog.LevelWarn {
				out = append(out, r)
			}
		}
		return out
	}
	w := warns()
	t.Logf("%d tries failed (last: %v); %d records, %d at Warn or above: %v", st.failed, st.last, len(rec.Records()), len(w), w[:min(len(w), 3)])
	if st.failed < 10 {
		t.Fatalf("only %d tries failed: the storm did not happen", st.failed)
	}
	if len(w) != 1 || !strings.Contains(w[0].Attrs["err"], "53300") {
		t.Errorf("%d records at Warn or above during the storm, want 1 naming the cause (53300): %v", len(w), w[:min(len(w), 3)])
	}
	limit("-1")
	waitFor(t, "a TryLock to succeed", 10*time.Second, func() bool {
		lk, err := l.TryLock(ctx, pglocks.KeyOf("logrun"))
		if err == nil {
			_ = lk.Unlock(ctx)
		}
		return err == nil
	})
	r, ok := rec.Wait(slog.LevelWarn, "again", 10*time.Second)
	if !ok || r.Attrs["failures"] == "" {
		t.Fatalf("no Warn that acquires succeed again, with the number of failures; %d records at Warn", len(warns()))
	}
	if w := warns(); len(w) != 2 {
		t.Errorf("%d records at Warn or above, want 2: %v", len(w), w)
	}
}

// TestInvalidInputStartsNoFailureRun: calls refused for their input (more
// permits than the limit, TryLockAll of no keys, an invalid key) are not
// failed acquires: no Warn, and no run of failures for the next
// acquisition to end with a Warn that acquires succeed again.
func TestInvalidInputStartsNoFailureRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec, log := logtest.New()
	l := newLocker(t, b.pool, advisory.Config{Logger: log})
	ctx := ctxT(t)
	sem, err := l.Semaphore("exports", 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sem.TryAcquire(ctx, 4); err == nil {
		t.Fatal("TryAcquire of 4 permits of 3 succeeded")
	}
	if _, err := l.TryLockAll(ctx); err == nil {
		t.Fatal("TryLockAll of no keys succeeded")
	}
	if _, err := l.TryLock(ctx, pglocks.Key{}); err == nil {
		t.Fatal("TryLock of the zero Key succeeded")
	}
	lk, err := l.TryLock(ctx, pglocks.KeyOf("exports-other"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lk.Unlock(ctx) }()
	if _, ok := rec.Wait(slog.LevelDebug, "advisory: acquired", 10*time.Second); !ok {
		t.Fatal("no Debug record of the acquisition")
	}
	for _, r := range rec.Records() {
		if r.Level >= slog.LevelWarn {
			t.Errorf("record at %v: %v", r.Level, r)
		}
	}
}
