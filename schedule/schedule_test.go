package schedule_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/schedule"
)

// TestSlotOnce: many replicas start one explicit slot at once: one runs
// it, every other gets a TakenError naming that run, and a slot run
// earlier is reported with its end and outcome.
func TestSlotOnce(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := pgtest.New(t)
	var rs []*replica
	for i := range 5 {
		rs = append(rs, newReplica(t, db, fmt.Sprintf("r%d", i), 0))
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		ran   []schedule.Record
		taken []*schedule.TakenError
	)
	for _, r := range rs {
		job := r.job(t, "once", schedule.Policy{})
		for range 4 {
			wg.Go(func() {
				rec, err := job.DoSlot(ctx, "2026-11-23", r.work)
				mu.Lock()
				defer mu.Unlock()
				var te *schedule.TakenError
				switch {
				case errors.As(err, &te):
					taken = append(taken, te)
				case err != nil:
					t.Error(err)
				default:
					ran = append(ran, rec)
				}
			})
		}
	}
	wg.Wait()
	if len(ran) != 1 || len(taken) != 19 {
		t.Fatalf("%d runs, %d taken; want 1 and 19", len(ran), len(taken))
	}
	if n := doneCount(t, rs[0].pool, "once", "2026-11-23"); n != 1 {
		t.Fatalf("the job wrote %d times, want 1", n)
	}
	run := ran[0]
	if run.Outcome != schedule.Succeeded || run.End.Before(run.Start) || run.Token < 1 {
		t.Errorf("run %+v", run)
	}
	for _, te := range taken {
		if te.By.Token != run.Token || te.By.Owner != run.Owner || te.Slot != "2026-11-23" || !errors.Is(te, schedule.ErrTaken) {
			t.Errorf("taken by %+v, want the run %+v", te.By, run)
		}
	}
	// Asked later, the slot is reported with its end: one statement, no lease.
	_, err := rs[1].job(t, "once", schedule.Policy{}).StartSlot(ctx, "2026-11-23")
	var te *schedule.TakenError
	if !errors.As(err, &te) || te.By.Outcome != schedule.Succeeded || !te.By.End.Equal(run.End) || te.By.Hostname != run.Hostname {
		t.Fatalf("later start: %v (%+v), want taken by %+v", err, te, run)
	}
	t.Logf("taken: %v", te)
}

// TestFailedRunTakesSlot: a run whose function fails has had its slot;
// its record says failed, with the error.
func TestFailedRunTakesSlot(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := newReplica(t, pgtest.New(t), "r", 0)
	job := r.job(t, "fails", schedule.Policy{})
	boom := errors.New("boom")
	rec, err := job.DoSlot(ctx, "s1", func(context.Context, *schedule.Run) error { return boom })
	if !errors.Is(err, boom) || rec.Outcome != schedule.Failed || rec.Error != "boom" {
		t.Fatalf("DoSlot: %v, %+v", err, rec)
	}
	_, err = job.DoSlot(ctx, "s1", func(context.Context, *schedule.Run) error { t.Error("ran twice"); return nil })
	var te *schedule.TakenError
	if !errors.As(err, &te) || te.By.Outcome != schedule.Failed {
		t.Fatalf("second DoSlot: %v", err)
	}
	// A panic ends the run, and goes on.
	func() {
		defer func() {
			if p := recover(); p != "oops" {
				t.Errorf("recovered %v", p)
			}
		}()
		_, _ = job.DoSlot(ctx, "s2", func(context.Context, *schedule.Run) error { panic("oops") })
	}()
	h, err := r.runner.History(ctx, "fails", 10)
	if err != nil || len(h) != 2 || h[0].Slot != "s2" || h[0].Outcome != schedule.Failed || h[0].Error != "panic" {
		t.Fatalf("history %v, %+v", err, h)
	}
	// The job's lease is free again: a third slot runs at once.
	if _, err := job.DoSlot(ctx, "s3", func(context.Context, *schedule.Run) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// TestHistory: the table keeps the newest Config.History runs of each job;
// History reads one job or all, newest first, and tokens only grow.
func TestHistory(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := pgtest.New(t)
	r := newReplica(t, db, "r", 0)
	runner, err := schedule.New(schedule.Config{Store: r.store, Pool: r.pool, History: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		job, err := runner.Job(name, schedule.Policy{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			if _, err := job.DoSlot(ctx, fmt.Sprint(i), r.work); err != nil {
				t.Fatal(err)
			}
		}
	}
	all, err := runner.History(ctx, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, rec := range all {
		got = append(got, fmt.Sprintf("%s/%s/%d", rec.Job, rec.Slot, rec.Token))
	}
	want := "[a/4/5 a/3/4 a/2/3 b/4/5 b/3/4 b/2/3]"
	if fmt.Sprint(got) != want {
		t.Fatalf("history %v, want %s", got, want)
	}
	one, err := runner.History(ctx, "b", 1)
	if err != nil || len(one) != 1 || one[0].Slot != "4" || one[0].Outcome != schedule.Succeeded {
		t.Fatalf("history of b: %v %+v", err, one)
	}
	// A slot pruned from the history may run again: the documented limit.
	job, _ := runner.Job("a", schedule.Policy{})
	if _, err := job.DoSlot(ctx, "0", r.work); err != nil {
		t.Fatalf("pruned slot: %v", err)
	}
}

// TestAtLeast: with AtLeast and no period, a job runs at most once per
// AtLeast by the server clock, whenever it is asked.
func TestAtLeast(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := pgtest.New(t)
	const every = 300 * time.Millisecond
	var jobs []*schedule.Job
	for i := range 3 {
		jobs = append(jobs, newReplica(t, db, fmt.Sprintf("r%d", i), time.Duration(i-1)*time.Hour).job(t, "every", schedule.Policy{AtLeast: every}))
	}
	var runs []schedule.Record
	deadline := time.Now().Add(time.Minute)
	for len(runs) < 4 && time.Now().Before(deadline) {
		for _, job := range jobs {
			rec, err := job.Do(ctx, func(context.Context, *schedule.Run) error { return nil })
			var te *schedule.TakenError
			switch {
			case errors.As(err, &te):
				if te.At.Sub(te.By.Start) >= every {
					t.Fatalf("taken at %v by a run started %v before", te.At, te.At.Sub(te.By.Start))
				}
			case err != nil:
				t.Fatal(err)
			default:
				runs = append(runs, rec)
			}
		}
	}
	if len(runs) < 4 {
		t.Fatalf("%d runs in a minute", len(runs))
	}
	for i := 1; i < len(runs); i++ {
		if gap := runs[i].Start.Sub(runs[i-1].Start); gap < every {
			t.Errorf("runs %d and %d started %v apart, want at least %v", i-1, i, gap, every)
		}
	}
}

// TestAtMost: with AtMost, a run's lease is not renewed: the run's context
// ends before AtMost, the server frees the job at AtMost, and the run is
// recorded as lost.
func TestAtMost(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := newReplica(t, pgtest.New(t), "r", 0)
	job := r.job(t, "bounded", schedule.Policy{AtMost: 500 * time.Millisecond})
	start := time.Now()
	rec, err := job.DoSlot(ctx, "s", func(ctx context.Context, run *schedule.Run) error {
		<-ctx.Done()
		return context.Cause(ctx)
	})
	took := time.Since(start)
	if !errors.Is(err, lease.ErrLost) || rec.Outcome != schedule.Lost {
		t.Fatalf("DoSlot: %v, %+v", err, rec)
	}
	// Before AtMost on a healthy machine (TTL − the store's safety
	// margin); a stalled one only delays it, which Guard fences.
	if took > 10*time.Second {
		t.Errorf("the run's context ended after %v, want about AtMost", took)
	}
	t.Logf("run ended after %v (AtMost 500ms): %v", took.Round(time.Millisecond), rec)
	// The lost run has had its slot.
	if _, err := job.StartSlot(ctx, "s"); !errors.Is(err, schedule.ErrTaken) {
		t.Fatalf("start after a lost run: %v", err)
	}
}

// TestBrokenRunIsFenced: an operator breaks the job's lease while a run
// works: the run's context ends, its guarded write fails, and it is
// recorded as lost; the slot is not run again.
func TestBrokenRunIsFenced(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := newReplica(t, pgtest.New(t), "r", 0)
	job := r.job(t, "fenced", schedule.Policy{})
	rec, err := job.DoSlot(ctx, "s", func(runCtx context.Context, run *schedule.Run) error {
		// The break goes on the test's ctx: the run's own ends as soon as
		// the store hears of the break, which may be before Break returns.
		if _, err := r.store.Break(ctx, schedule.LeasePrefix+"fenced"); err != nil {
			return err
		}
		<-runCtx.Done()
		return r.work(context.Background(), run)
	})
	if !errors.Is(err, lease.ErrNotHeld) || !errors.Is(err, lease.ErrLost) || rec.Outcome != schedule.Lost {
		t.Fatalf("DoSlot: %v, %+v", err, rec)
	}
	if n := doneCount(t, r.pool, "fenced", "s"); n != 0 {
		t.Fatalf("the broken run wrote %d rows", n)
	}
	if _, err := job.StartSlot(ctx, "s"); !errors.Is(err, schedule.ErrTaken) {
		t.Fatalf("start after a lost run: %v", err)
	}
}
