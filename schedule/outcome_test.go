package schedule_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/schedule"
)

// TestRecordString: a zero Record, as Do returns with an error, prints as
// no run, not as an empty run.
func TestRecordString(t *testing.T) {
	t.Parallel()
	if got := (schedule.Record{}).String(); got != "no run" {
		t.Errorf("zero Record prints %q, want %q", got, "no run")
	}
	rec := schedule.Record{Job: "j", Slot: "s", Token: 3, Hostname: "h", PID: 7, Outcome: schedule.Failed, Error: "boom"}
	if got, want := rec.String(), "j slot s: token 3 on h (pid 7), failed: boom"; got != want {
		t.Errorf("Record prints %q, want %q", got, want)
	}
}

// TestMarkGuardFails: the job's lease is broken between a Start's acquire
// and its mark: the mark's Guard fails, nothing is marked — for certain,
// and the error says so, not "outcome unknown" — and the slot runs at the
// next Start.
func TestMarkGuardFails(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := newReplica(t, pgtest.New(t), "r", 0)
	job := r.job(t, "guarded", schedule.Policy{})
	schedule.SetBeforeMark(job, func() {
		if _, err := r.store.Break(ctx, schedule.LeasePrefix+"guarded"); err != nil {
			t.Error(err)
		}
	})
	_, err := job.StartSlot(ctx, "s")
	if !errors.Is(err, lease.ErrNotHeld) || strings.Contains(err.Error(), "unknown") || !strings.Contains(err.Error(), "nothing marked") {
		t.Fatalf("Start whose lease was broken before its mark: %v, want ErrNotHeld, nothing marked", err)
	}
	t.Logf("Start whose lease was broken before its mark: %v", err)
	schedule.SetBeforeMark(job, nil)
	if _, err := job.DoSlot(ctx, "s", r.work); err != nil {
		t.Fatalf("the slot after a failed mark: %v", err)
	}
}

// TestEndReplyLost: the reply to the record of a run's end is lost (the
// statement ran: the table says succeeded): End must not report the
// outcome it meant to write as written, but Unknown, with an error.
func TestEndReplyLost(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := pgtest.New(t)
	direct := newReplica(t, db, "direct", 0)
	proxy, dsn := db.Proxy(t)
	r := newReplicaOn(t, pgtest.NewPool(t, dsn), "r")
	run, err := r.job(t, "lost-reply", schedule.Policy{}).StartSlot(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	proxy.DropReplies()
	type ended struct {
		rec schedule.Record
		err error
	}
	done := make(chan ended, 1)
	go func() {
		rec, err := run.End(ctx, nil)
		done <- ended{rec, err}
	}()
	waitFor(t, "the end's record to commit", func() bool {
		var o string
		err := direct.pool.QueryRow(ctx, `select outcome from pglocks_runs where job = 'lost-reply' and slot = 's'`,
			pgx.QueryExecModeExec).Scan(&o)
		return err == nil && o == string(schedule.Succeeded)
	})
	proxy.Pass()
	proxy.Reset()
	e := <-done
	if e.err == nil || e.rec.Outcome != schedule.Unknown {
		t.Fatalf("End whose reply was lost: %v, %v; want an error and outcome unknown", e.rec, e.err)
	}
	t.Logf("End whose reply was lost: %v: %v", e.rec, e.err)
}

// TestLostRunErrorSaysLoss: the run's lease is lost while fn runs, and fn
// returns what its cancelled context gives it, context.Canceled, as a
// query cut short does. Do's error says first, on one line, that the
// lease was lost — fn's "context canceled" is only its consequence, and
// the caller's ctx is alive — and wraps both.
func TestLostRunErrorSaysLoss(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := newReplica(t, pgtest.New(t), "r", 0)
	job := r.job(t, "lost-error", schedule.Policy{})
	rec, err := job.DoSlot(ctx, "s", func(runCtx context.Context, run *schedule.Run) error {
		if _, err := r.store.Break(ctx, schedule.LeasePrefix+"lost-error"); err != nil {
			return err
		}
		<-runCtx.Done()
		return runCtx.Err()
	})
	if ctx.Err() != nil {
		t.Fatal(ctx.Err())
	}
	if !errors.Is(err, lease.ErrLost) || !errors.Is(err, context.Canceled) || rec.Outcome != schedule.Lost {
		t.Fatalf("DoSlot: %v, %+v; want lease.ErrLost and context.Canceled, outcome lost", err, rec)
	}
	if msg := err.Error(); !strings.HasPrefix(msg, `schedule: job "lost-error" slot s: the run's lease was lost while it ran`) ||
		strings.Contains(msg, "\n") {
		t.Fatalf("DoSlot's error %q: want one line that says first the lease was lost", msg)
	}
	t.Logf("DoSlot whose lease was lost: %v", err)
}

// TestReleasedRunNoError: fn releasing its own run's lease ends the lease
// while fn runs, but nothing was lost: the run is recorded as fn's result
// and Do returns fn's error (nil), not a loss.
func TestReleasedRunNoError(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := newReplica(t, pgtest.New(t), "r", 0)
	job := r.job(t, "released", schedule.Policy{})
	rec, err := job.DoSlot(ctx, "s", func(_ context.Context, run *schedule.Run) error {
		return run.Lease().Release(ctx)
	})
	if rec.Outcome != schedule.Succeeded || err != nil {
		t.Fatalf("a run that released its own lease: outcome %v, err %v; want succeeded, nil", rec.Outcome, err)
	}
}
