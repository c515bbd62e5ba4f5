package schedule

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pglocks/pglocks/internal/outcome"
	"github.com/pglocks/pglocks/lease"
)

// Run is one started run of a job: its slot is marked as taken, and it
// holds the job's lease, whose token fences the run's writes. End it with
// [Run.End] or [Run.Finish]. Its methods are safe for concurrent use.
type Run struct {
	job   *Job
	lease *lease.Lease
	rec   Record
	at    time.Time

	mu    sync.Mutex
	ended bool
	final Record
}

var (
	errNilRun  = errors.New("schedule: nil *Run (no run was started: check the Start error)")
	errZeroRun = errors.New("schedule: zero Run (runs come from Job.Start, StartSlot, Do or DoSlot)")
)

func (r *Run) usable() error {
	switch {
	case r == nil:
		return errNilRun
	case r.job == nil:
		return errZeroRun
	}
	return nil
}

// Record returns the run's record as it started (Outcome Running).
func (r *Run) Record() Record {
	if r == nil {
		return Record{}
	}
	return r.rec
}

// At returns the server time at which the run's Start read the clock and
// decided its slot (zero for a nil Run).
func (r *Run) At() time.Time {
	if r == nil {
		return time.Time{}
	}
	return r.at
}

// Lease returns the job's lease that the run holds: pass it to
// [lease.Lease.Guard] in the transactions that write the job's results, or
// send its Token with each write to a resource that refuses lower tokens.
// A nil Run's is nil.
func (r *Run) Lease() *lease.Lease {
	if r == nil {
		return nil
	}
	return r.lease
}

// Context returns a context cancelled when the run's lease ends: lost (its
// cause wraps lease.ErrLost), or released when the run ended. For a run
// with Policy.AtMost, it is lost a safety margin before AtMost.
func (r *Run) Context() context.Context {
	if r == nil {
		return (*lease.Lease)(nil).Context()
	}
	return r.lease.Context()
}

// End records the run's end — [Succeeded] when err is nil, [Failed] with
// err's text otherwise, [Lost] whatever err when the run's lease was lost
// — and releases the job's lease, in that order, so that no later Start
// takes a run whose end is being recorded for a crashed one. It returns
// the final record.
//
// End is cleanup: it runs on a context detached from ctx (its values
// kept, its cancellation not), bounded by 30 s. If the record of the end
// fails, End returns an error and a Record whose Outcome is [Unknown] when
// the statement may have run (its reply never came: the table says the
// outcome meant, or running), or [Crashed] when it did not; a run left
// recorded as running counts as crashed (with RerunCrashed, the slot may
// run again). The lease is released all the same (see
// lease.Lease.Release, which ends the lease whatever happens). A second
// End returns the first one's record and an error.
func (r *Run) End(ctx context.Context, err error) (Record, error) {
	o := Succeeded
	if err != nil {
		o = Failed
	}
	return r.end(ctx, o, err)
}

// Finish is [Run.End] for a caller that does not know how the run went:
// the outcome is [Finished] (or [Lost]).
func (r *Run) Finish(ctx context.Context) (Record, error) {
	return r.end(ctx, Finished, nil)
}

func (r *Run) end(ctx context.Context, o Outcome, runErr error) (Record, error) {
	if err := r.usable(); err != nil {
		return Record{}, err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return r.final, fmt.Errorf("schedule: job %q slot %s: run already ended", r.rec.Job, r.rec.Slot)
	}
	r.ended = true
	if errors.Is(r.lease.Err(), lease.ErrLost) {
		o = Lost
	}
	ctx, cancel := detached(ctx, cleanupTimeout)
	defer cancel()
	rec, recErr := r.record(ctx, o, runErr)
	r.final = rec
	relErr := r.lease.Release(ctx)
	if relErr != nil && (errors.Is(relErr, lease.ErrNotHeld) || errors.Is(relErr, lease.ErrReleased) || errors.Is(relErr, lease.ErrLost)) {
		relErr = nil // the lease ended (lost, or released in the background)
	}
	if relErr != nil {
		relErr = fmt.Errorf("schedule: job %q slot %s: release the job: %w", rec.Job, rec.Slot, relErr)
	}
	return rec, errors.Join(recErr, relErr)
}

// record writes the run's end, unless a later run marked it crashed.
func (r *Run) record(ctx context.Context, o Outcome, runErr error) (Record, error) {
	rec := r.rec
	rec.Outcome = o
	var text pgtype.Text
	if runErr != nil {
		rec.Error = errorText(runErr)
		text = pgtype.Text{String: rec.Error, Valid: true}
	}
	q := r.job.r
	var start, end time.Time
	err := q.cfg.Pool.QueryRow(ctx, q.q.end, q.args(rec.Job, rec.Token, string(o), text)...).Scan(&start, &end)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		rec.Outcome = Crashed
		return rec, fmt.Errorf("schedule: job %q slot %s: the run was marked crashed by a later run: its lease was lost, then taken", rec.Job, rec.Slot)
	case err != nil:
		rec.Outcome = Crashed // not recorded: the row stays running, crashed once the lease is released
		if outcome.Of(err) == outcome.Unknown {
			rec.Outcome = Unknown
			return rec, fmt.Errorf("schedule: job %q slot %s: record the run's end (%s): outcome unknown (the table says %s, "+
				"or running and then crashed): %w", rec.Job, rec.Slot, o, o, err)
		}
		return rec, fmt.Errorf("schedule: job %q slot %s: record the run's end (%s): not recorded (the run counts as crashed): %w",
			rec.Job, rec.Slot, o, q.explain(err))
	}
	rec.Start, rec.End = start, end
	return rec, nil
}

// errorText is err's text as the run table keeps it: valid UTF-8 without
// NUL, at most 2000 bytes.
func errorText(err error) string {
	s := strings.ToValidUTF8(strings.ReplaceAll(err.Error(), "\x00", ""), "\uFFFD")
	if len(s) > 2000 {
		s = strings.ToValidUTF8(s[:2000], "")
	}
	return s
}

// Do starts a run of the slot of this moment (see [Job.Start]), runs fn
// with a context that is cancelled when ctx ends or the run's lease is
// lost, and ends the run with fn's error (see [Run.End]) — also when fn
// panics, before the panic goes on. It returns the run's final record and
// fn's error, joined with End's error. If the lease was lost while fn ran
// (fn may then not have been alone), the error says so first, on one
// line, and wraps [lease.ErrLost] and then fn's error, which is often only
// the loss's consequence: context.Canceled from fn's context, though ctx
// is alive. When the slot is taken, it returns a [*TakenError] and does
// not call fn.
func (j *Job) Do(ctx context.Context, fn func(ctx context.Context, run *Run) error) (Record, error) {
	if fn == nil {
		return Record{}, invalid("Do: nil function")
	}
	run, err := j.Start(ctx)
	if err != nil {
		return Record{}, err
	}
	return run.do(ctx, fn)
}

// DoSlot is [Job.Do] for an explicit slot key (see [Job.StartSlot]).
func (j *Job) DoSlot(ctx context.Context, key string, fn func(ctx context.Context, run *Run) error) (Record, error) {
	if fn == nil {
		return Record{}, invalid("DoSlot: nil function")
	}
	run, err := j.StartSlot(ctx, key)
	if err != nil {
		return Record{}, err
	}
	return run.do(ctx, fn)
}

func (r *Run) do(ctx context.Context, fn func(ctx context.Context, run *Run) error) (Record, error) {
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(r.lease.Context(), func() { cancel(context.Cause(r.lease.Context())) })
	defer stop()
	returned := false
	defer func() {
		if !returned { // fn panicked: end the run, and let the panic go on
			_, _ = r.End(ctx, errors.New("panic"))
		}
	}()
	runErr := fn(fctx, r)
	returned = true
	leaseErr := r.lease.Err() // before End releases it: why it ended while fn ran, if it did
	rec, endErr := r.End(ctx, runErr)
	return rec, errors.Join(r.doErr(rec, leaseErr, runErr), endErr)
}

// doErr is the error of Do for fn's error runErr: when the run's lease
// was lost while fn ran (rec says Lost, or leaseErr wraps lease.ErrLost
// though End could not record it), that loss comes first — fn's error,
// often only its consequence (its context cancelled), is wrapped after
// it, on the same line. A lease that ended otherwise (fn released it, the
// Store closed) is End's to report.
func (r *Run) doErr(rec Record, leaseErr, runErr error) error {
	var err error
	switch {
	case rec.Outcome == Lost: // End saw the loss: the lease's error wraps lease.ErrLost
		err = fmt.Errorf("schedule: job %q slot %s: the run's lease was lost while it ran, so it may not have been alone: %w",
			r.rec.Job, r.rec.Slot, r.lease.Err())
	case errors.Is(leaseErr, lease.ErrLost):
		err = fmt.Errorf("schedule: job %q slot %s: the run's lease was lost while it ran, so it may not have been alone: %w",
			r.rec.Job, r.rec.Slot, leaseErr)
	default:
		return runErr
	}
	if runErr != nil {
		err = fmt.Errorf("%w (fn returned: %w)", err, runErr)
	}
	return err
}
