package schedule_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/schedule"
)

// firing is what one tick of one replica's timer did.
type firing struct {
	replica, job string
	own          time.Time // the replica's clock at the tick
	at           time.Time // the server's, when Start read it
	slot         string
	ran          bool
	late         bool          // ErrWindowClosed: the Start marked after its slot's window
	took         time.Duration // Start's latency
}

// TestSkewedReplicas is the property the package exists for. Five
// replicas whose clocks are up to ±2 s apart — eight 250 ms slots — each
// tick once per slot by their own clock, as a cron or a ticker would:
// their ticks reach the server at phases spread over the slot, two of them
// a little before the slot starts (within Tolerance). The jobs are far
// shorter than the skew. Four jobs run side by side, so that 200 slots take
// 50 slots' time. Every slot must be run exactly once — by the runs Start
// reports and by the rows the jobs wrote — none missed, and every Start's
// slot must be the test's own computation from the server time Start read.
func TestSkewedReplicas(t *testing.T) {
	t.Parallel()
	const (
		period    = 250 * time.Millisecond
		tolerance = 80 * time.Millisecond
		jobs      = 4
	)
	perJob := 50
	if n, err := strconv.Atoi(os.Getenv("SCHEDULE_SLOTS")); err == nil && n > 0 {
		perJob = n
	}
	// A tick at a multiple of the period on a clock skewed by s reaches the
	// server at phase −s mod 250 ms: 0, 120 ms, −30 ms (early), 30 ms and
	// −60 ms (early).
	skews := []time.Duration{-2000 * time.Millisecond, -1370 * time.Millisecond, 530 * time.Millisecond,
		1970 * time.Millisecond, -690 * time.Millisecond}
	db := pgtest.New(t)
	ctx := ctxT(t)
	policy := schedule.Policy{Period: period, Tolerance: tolerance}
	var (
		mu      sync.Mutex
		firings []firing
		wg      sync.WaitGroup
	)
	stop := make(chan struct{})
	for i, skew := range skews {
		r := newReplica(t, db, fmt.Sprintf("replica-%d", i+1), skew)
		for j := range jobs {
			job := r.job(t, fmt.Sprintf("job-%d", j), policy)
			wg.Go(func() {
				for {
					f, ok := tick(ctx, t, r, job, period, stop)
					if !ok {
						return
					}
					mu.Lock()
					firings = append(firings, f)
					mu.Unlock()
				}
			})
		}
	}
	start := time.Now()
	<-time.After(time.Duration(perJob+3) * period) // the schedule's length: the test's own timer
	close(stop)
	wg.Wait()
	t.Logf("%d ticks of %d replicas on %d jobs in %v", len(firings), len(skews), jobs, time.Since(start).Round(time.Millisecond))
	checkSlots(t, db, firings, jobs, perJob, period, tolerance)
}

// tick waits for the replica's next tick — the next multiple of period on
// its own clock — and starts the job's slot then.
func tick(ctx context.Context, t *testing.T, r *replica, job *schedule.Job, period time.Duration, stop <-chan struct{}) (firing, bool) {
	own := r.now()
	next := own.Truncate(period).Add(period)
	select {
	case <-stop:
		return firing{}, false
	case <-time.After(next.Sub(own)):
	}
	f := firing{replica: r.name, job: job.Name(), own: r.now()}
	begin := time.Now()
	run, err := job.Start(ctx)
	f.took = time.Since(begin)
	var te *schedule.TakenError
	switch {
	case errors.As(err, &te):
		f.at, f.slot = te.At, te.Slot
	case errors.Is(err, schedule.ErrWindowClosed):
		t.Logf("%s %s: %v", r.name, job.Name(), err) // a tick at the window's very end, or a stalled Start
		f.late = true
	case err != nil:
		t.Errorf("%s %s: %v", r.name, job.Name(), err)
		return firing{}, false
	default:
		f.at, f.slot, f.ran = run.At(), run.Record().Slot, true
		work := r.work(run.Context(), run)
		if _, err := run.End(ctx, work); err != nil || work != nil {
			t.Errorf("%s %s: run %v, end %v", r.name, job.Name(), work, err)
		}
	}
	return f, true
}

// checkSlots checks every slot of every job, as described in
// TestSkewedReplicas, and logs the figures.
func checkSlots(t *testing.T, db *pgtest.DB, firings []firing, jobs, perJob int, period, tolerance time.Duration) {
	pool := newReplica(t, db, "checker", 0).pool
	var slots, dups, missed, stalled, early, clientDups, clientMissed int
	var runLat, takenLat []time.Duration
	for j := range jobs {
		name := fmt.Sprintf("job-%d", j)
		runs, ticks := map[string]int{}, map[string]int{}
		var keys []string
		for _, f := range firings {
			if f.job != name || f.late {
				continue
			}
			want := slotOf(f.at, period, tolerance)
			if f.slot != schedule.SlotKey(want) {
				t.Errorf("%s %s at %v: slot %s, want %s", f.replica, name, f.at, f.slot, want)
			}
			if f.at.Before(want) {
				early++ // within Tolerance before the slot's start: the slot is the next one
			}
			if ticks[f.slot]++; ticks[f.slot] == 1 {
				keys = append(keys, f.slot)
			}
			if f.ran {
				runs[f.slot]++
				runLat = append(runLat, f.took)
			} else {
				takenLat = append(takenLat, f.took)
			}
		}
		slices.Sort(keys) // schedule.SlotKey keys sort as text in time order
		if len(keys) < 3 {
			t.Fatalf("%s: ticks reached %d slots, want %d (at least 3)", name, len(keys), perJob+2)
		}
		inner := keys[1 : len(keys)-1] // the first and last slot may have had only some replicas
		first, _ := time.Parse(time.RFC3339Nano, inner[0])
		for k := first; !k.After(first.Add(time.Duration(len(inner)-1) * period)); k = k.Add(period) {
			key := schedule.SlotKey(k)
			slots++
			wrote := doneCount(t, pool, name, key)
			switch {
			case ticks[key] == 0:
				// No replica asked in time: every replica was stalled (a
				// loaded machine), which the schedule cannot cure.
				stalled++
				t.Logf("%s slot %s: no replica's tick reached the server within the slot's window (the machine stalled)", name, key)
			case runs[key] == 0 && wrote == 0:
				// Asked, not run: the replica that took the job stalled
				// past the window before it could mark the slot, or the
				// job's previous run outlasted this slot's window. Judged
				// below, against the evidence of stalls.
				missed++
				t.Logf("%s slot %s: 0 runs, %d ticks", name, key, ticks[key])
			case runs[key] != 1 || wrote != 1:
				t.Errorf("%s slot %s: %d runs, %d writes, %d ticks; want 1 run", name, key, runs[key], wrote, ticks[key])
				dups += max(0, runs[key]-1)
			}
		}
		cd, cm := clientClockLocker(firings, name, inner, period, tolerance)
		clientDups, clientMissed = clientDups+cd, clientMissed+cm
	}
	t.Logf("%d slots (%d jobs × %d), %d ticks (%d of them before their slot's start, within Tolerance): duplicates %d, missed %d, no tick in time %d",
		slots, jobs, slots/jobs, len(firings), early, dups, missed, stalled)
	if early == 0 {
		t.Error("no tick reached the server early: the test does not exercise Tolerance")
	}
	t.Logf("Start latency: run p50 %v p99 %v; taken p50 %v p99 %v", pct(runLat, 50), pct(runLat, 99), pct(takenLat, 50), pct(takenLat, 99))
	late := 0
	for _, f := range firings {
		if f.late {
			late++
		}
	}
	t.Logf("%d Starts came to mark after their slot's window had closed (ErrWindowClosed)", late)
	// Exactly once on a machine that kept time; at most once, always (the
	// duplicates above fail the test whatever the load).
	if missed > 0 && late == 0 && stalled == 0 {
		t.Errorf("%d slots were asked for in time and not run, with no Start late and no slot without a tick: not a stall", missed)
	}
	if (missed+stalled)*2 > slots {
		t.Errorf("%d of %d slots not run: the machine was too stalled for the test to say anything", missed+stalled, slots)
	}
	t.Logf("the same ticks keyed by each replica's own clock (gocron's SQL locker): %d slots run twice or more, %d missed", clientDups, clientMissed)
}

// clientClockLocker replays the ticks of job through a locker that keys a
// run by the slot of the replica's own clock (first tick of a key runs),
// and counts the server slots among inner run more than once, and not run.
func clientClockLocker(firings []firing, job string, inner []string, period, tolerance time.Duration) (dups, missed int) {
	seen := map[time.Time]bool{}
	runs := map[string]int{}
	ordered := slices.Clone(firings)
	slices.SortFunc(ordered, func(a, b firing) int { return a.at.Compare(b.at) })
	for _, f := range ordered {
		if key := slotOf(f.own, period, tolerance); f.job == job && !f.late && !seen[key] {
			seen[key] = true
			runs[f.slot]++
		}
	}
	for _, key := range inner {
		dups += min(runs[key], 2) / 2
		if runs[key] == 0 {
			missed++
		}
	}
	return dups, missed
}

// pct returns the p-th percentile of ds.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)].Round(100 * time.Microsecond)
}
