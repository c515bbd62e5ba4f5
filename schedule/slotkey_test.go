package schedule_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/schedule"
)

// TestSlotKey: one instant spelled four ways has one SlotKey, so a tick
// keyed by it runs once; keys have one length and sort as text in time
// order; a period slot's key is its start's SlotKey.
func TestSlotKey(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := newReplica(t, pgtest.New(t), "r", 0)
	paris := time.FixedZone("CET", 3600)
	parsed, err := time.Parse(time.RFC3339Nano, "2026-11-23T05:00:29.600+01:00")
	if err != nil {
		t.Fatal(err)
	}
	instant := time.Date(2026, 11, 23, 4, 0, 29, 600_000_000, time.UTC)
	spellings := []time.Time{instant, instant.In(paris), instant.Add(999 * time.Nanosecond), parsed}
	const want = "2026-11-23T04:00:29.600000Z"
	job := r.job(t, "tick", schedule.Policy{})
	ran := 0
	for _, at := range spellings {
		key := schedule.SlotKey(at)
		if key != want {
			t.Errorf("SlotKey(%v) = %q, want %q", at, key, want)
		}
		_, err := job.DoSlot(ctx, key, r.work)
		switch {
		case err == nil:
			ran++
		case !errors.Is(err, schedule.ErrTaken):
			t.Fatal(err)
		}
	}
	if ran != 1 {
		t.Fatalf("one instant spelled %d ways ran %d times", len(spellings), ran)
	}
	whole := schedule.SlotKey(instant.Truncate(time.Second))
	if len(whole) != len(want) || !(whole < want) {
		t.Errorf("SlotKey of %v is %q: it must have %q's length and sort before it", instant.Truncate(time.Second), whole, want)
	}
	// A period slot's key.
	policy := schedule.Policy{Period: time.Hour}
	start := awaitRoom(t, r.pool, time.Hour, r.job(t, "hourly", policy).Policy().Tolerance, 10*time.Second)
	rec, err := r.job(t, "hourly", policy).Do(ctx, r.work)
	if err != nil || rec.Slot != schedule.SlotKey(start) {
		t.Fatalf("period slot: %v, key %q, want %q", err, rec.Slot, schedule.SlotKey(start))
	}
}

// TestOldSlotKey: a period slot run by an earlier version, whose key drops
// trailing zeros ("…:00Z"), is the same slot: a Start finds it taken,
// also when the old run is marked between its read of the slot and its
// mark (a rolling upgrade).
func TestOldSlotKey(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := newReplica(t, pgtest.New(t), "r", 0)
	policy := schedule.Policy{Period: time.Hour}
	job := r.job(t, "upgrade", policy)
	start := awaitRoom(t, r.pool, time.Hour, job.Policy().Tolerance, 10*time.Second)
	old := start.UTC().Format(time.RFC3339Nano)
	if old == schedule.SlotKey(start) || !strings.HasSuffix(old, ":00Z") {
		t.Fatalf("old key %q", old)
	}
	schedule.SetAfterPeek(job, func() { // an old replica runs the slot meanwhile
		if _, err := r.pool.Exec(ctx, `insert into pglocks_runs (job, token, slot, slot_start, owner, started_at, ended_at, outcome)
			values ('upgrade', 0, $1, $2, gen_random_uuid(), clock_timestamp(), clock_timestamp(), 'succeeded')`,
			pgx.QueryExecModeExec, old, start); err != nil {
			t.Error(err)
		}
	})
	_, err := job.Do(ctx, func(context.Context, *schedule.Run) error { t.Error("ran a slot an old replica ran"); return nil })
	var te *schedule.TakenError
	if !errors.As(err, &te) || te.By.Slot != old {
		t.Fatalf("start of a slot an old replica ran: %v", err)
	}
	schedule.SetAfterPeek(job, nil)
	if _, err := job.Do(ctx, r.work); !errors.As(err, &te) || te.By.Slot != old {
		t.Fatalf("second start: %v", err)
	}
}
