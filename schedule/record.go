package schedule

import (
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// Outcome is how a run ended, as its record says.
type Outcome string

// The outcomes of a run.
const (
	// Running: the run started and its end is not recorded; its lease is
	// still held.
	Running Outcome = "running"
	// Succeeded: the run ended, its function without error.
	Succeeded Outcome = "succeeded"
	// Failed: the run ended, its function with an error (Record.Error).
	Failed Outcome = "failed"
	// Finished: the run ended; its caller did not say how ([Run.Finish]:
	// gocron, for one, does not tell its Locker).
	Finished Outcome = "finished"
	// Lost: the run ended after its lease was lost (expired while it
	// stalled, broken by an operator): it may not have been alone, and its
	// guarded writes failed from the loss on.
	Lost Outcome = "lost"
	// Crashed: the run's lease ended before its end was recorded — its
	// process died, or lost the database for longer than its lease, or the
	// record of its start or end had an unknown outcome, or it outlasted
	// Policy.AtMost (whose lease is not renewed). It may have done none,
	// part or all of its work — and after an AtMost overrun, or renewals
	// that failed, it may still be running: "crashed" says the job is no
	// longer held for it, not that it stopped.
	Crashed Outcome = "crashed"
	// Unknown: only in the Record that [Run.End] returns, never in the
	// table: the record of the run's end was sent but its reply never
	// came, so the table says either the outcome End meant to write or
	// running (then crashed, once the run's lease ended).
	Unknown Outcome = "unknown"
)

// Record is one run of a job, as the run table keeps it. Times are by the
// server's clock.
type Record struct {
	// Job is the job's name.
	Job string
	// Slot is the slot's key: a period slot's start as [SlotKey] gives it
	// (runs of earlier versions: RFC 3339 without trailing zeros), an
	// explicit key as given to [Job.StartSlot], or for an AtLeast-only job
	// the SlotKey of the server time at which the run was decided.
	Slot string
	// SlotStart is a period slot's start; zero for other slots.
	SlotStart time.Time
	// Owner is the owner of the run's lease, Token its fencing token:
	// greater than the token of every earlier run of the job.
	Owner uuid.UUID
	Token int64
	// Hostname and PID identify the process that ran it (the lease
	// store's Config.Hostname and Config.PID).
	Hostname string
	PID      int
	// Start is when the run was marked as started; End when its end was
	// recorded (zero while running, or when crashed).
	Start, End time.Time
	// Outcome is how it ended.
	Outcome Outcome
	// Error is the run's error, for Failed.
	Error string
}

// String describes the run in one line; the zero Record, which Do and
// End return with some errors, is "no run".
func (r Record) String() string {
	if r.Job == "" && r.Token == 0 && r.Outcome == "" {
		return "no run"
	}
	s := fmt.Sprintf("%s slot %s: token %d on %s (pid %d), %s", r.Job, r.Slot, r.Token, r.Hostname, r.PID, r.Outcome)
	if !r.End.IsZero() && !r.Start.IsZero() {
		s += fmt.Sprintf(" in %v", r.End.Sub(r.Start).Round(time.Millisecond))
	}
	if r.Error != "" {
		s += ": " + r.Error
	}
	return s
}

var (
	// ErrTaken is wrapped by the error of a Start whose slot another run
	// has had or has: the error is a [*TakenError] naming that run.
	ErrTaken = errors.New("schedule: slot taken")

	// ErrBusy is wrapped by the error of a Start whose slot was not run:
	// another slot's run held the job until this slot's window closed, and
	// no other replica ran the slot meanwhile (else the Start returns a
	// [*TakenError] naming that run). It wraps [ErrWindowClosed] too.
	ErrBusy = errors.New("schedule: job busy with another slot")

	// ErrWindowClosed is wrapped by the error of a Start that came too
	// late for its period slot: the slot's window had closed (or a later
	// slot had run) by the time it could mark the run — its replica
	// stalled, or waited for the job ([ErrBusy] errors wrap it too). The
	// slot was not run by this Start, and no Start will run it now.
	ErrWindowClosed = errors.New("schedule: the slot's window closed")
)

// TakenError is the error of a Start that found its slot taken: another
// replica runs it or ran it (or, with Policy.AtLeast, a run started too
// recently). errors.Is(err, ErrTaken) reports true for it.
type TakenError struct {
	// Job is the job's name; Slot the slot this Start asked for.
	Job, Slot string
	// At is the server time at which this Start read the clock.
	At time.Time
	// By is the run that took the slot. While that run is starting (it
	// holds the job's lease but has not marked the slot yet), By.Start is
	// its lease's acquisition time.
	By Record
}

// Error describes the run that took the slot.
func (e *TakenError) Error() string {
	if e == nil {
		return "schedule: nil *TakenError"
	}
	return fmt.Sprintf("schedule: job %q slot %s: taken by token %d on %s (pid %d, owner %s), %s",
		e.Job, e.Slot, e.By.Token, e.By.Hostname, e.By.PID, e.By.Owner, e.By.Outcome)
}

// Is reports whether target is ErrTaken.
func (e *TakenError) Is(target error) bool { return target == ErrTaken }

// scanRecord scans recordColumns into a record of job; ok is false when
// the columns are null (no run).
func scanRecord(job string, dest func(...any) error, before ...any) (rec Record, ok bool, err error) {
	var (
		token              pgtype.Int8
		slot, host, status pgtype.Text
		errText            pgtype.Text
		slotStart, end     pgtype.Timestamptz
		start              pgtype.Timestamptz
		owner              pgtype.UUID
		pid                pgtype.Int4
	)
	err = dest(append(before, &token, &slot, &slotStart, &owner, &host, &pid, &start, &end, &status, &errText)...)
	if err != nil || !token.Valid {
		return Record{}, false, err
	}
	rec = Record{Job: job, Slot: slot.String, Token: token.Int64, Hostname: host.String, PID: int(pid.Int32),
		Outcome: Outcome(status.String), Error: errText.String}
	if owner.Valid {
		rec.Owner = owner.Bytes
	}
	if slotStart.Valid {
		rec.SlotStart = slotStart.Time
	}
	if start.Valid {
		rec.Start = start.Time
	}
	if end.Valid {
		rec.End = end.Time
	}
	return rec, true, nil
}
