package schedule

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pglocks/pglocks/internal/outcome"
	"github.com/pglocks/pglocks/lease"
)

// errCommit marks the error of the mark's commit: the one step whose
// failure may leave the run marked (every earlier failure rolls the
// transaction back).
type errCommit struct{ err error }

func (e errCommit) Error() string { return e.err.Error() }
func (e errCommit) Unwrap() error { return e.err }

// mark records the run of sl under lease l, in a transaction guarded by l:
// it commits only while l holds the job, and no other owner can take the
// job before it ends. It returns the Run, or a TakenError when the slot
// turned out to be taken (a replica that read the slot as free before
// another ran it), or an error wrapping ErrWindowClosed when the Start
// came too late for its period slot, or an error; on error or TakenError
// the caller releases l. Older runs still recorded as running are marked
// crashed on the way (l's token is higher: their leases ended).
//
// If the commit's outcome is unknown, the run may be recorded as started:
// it is not started, and the record, still running once l is released,
// counts as crashed — a slot missed, never run twice (with RerunCrashed,
// another Start may run it). A failure before the commit (the Guard's,
// say: l was lost) marks nothing, for certain.
func (j *Job) mark(ctx context.Context, l *lease.Lease, sl slot) (*Run, error) {
	rec, taken, err := j.markTx(ctx, l, sl)
	var ce errCommit
	switch {
	case err == nil:
	case errors.As(err, &ce) && outcome.Of(ce.err) == outcome.Unknown:
		return nil, fmt.Errorf("schedule: job %q slot %s: mark the run: outcome unknown (the slot may show a run "+
			"that never started, counted as crashed; the job was not run): %w", j.name, sl.key, err)
	case errors.Is(err, ErrWindowClosed):
		return nil, err
	default:
		return nil, fmt.Errorf("schedule: job %q slot %s: mark the run: nothing marked, the job was not run: %w", j.name, sl.key, j.r.explain(err))
	}
	if taken != nil {
		return nil, &TakenError{Job: j.name, Slot: sl.key, At: sl.at, By: *taken}
	}
	return &Run{job: j, lease: l, rec: rec, at: sl.at}, nil
}

func (j *Job) markTx(ctx context.Context, l *lease.Lease, sl slot) (rec Record, taken *Record, err error) {
	cfg := j.r.cfg
	tx, err := cfg.Pool.Begin(ctx)
	if err != nil {
		return Record{}, nil, err
	}
	defer func() {
		if err != nil {
			rctx, cancel := detached(ctx, cleanupTimeout)
			defer cancel()
			_ = tx.Rollback(rctx)
		}
	}()
	if err := l.Guard(ctx, tx); err != nil {
		return Record{}, nil, err
	}
	host, pid := cfg.Store.Config().Hostname, cfg.Store.Config().PID
	p := j.policy
	var (
		started pgtype.Timestamptz
		late    pgtype.Text
	)
	prev, found, err := scanRecord(j.name, tx.QueryRow(ctx, j.r.q.mark, j.r.args(j.name, l.Token(), sl.key, sl.startArg(),
		pgtype.UUID{Bytes: l.Owner(), Valid: true}, host, int32(pid), p.RerunCrashed,
		p.AtLeast.Microseconds(), int32(cfg.History), p.Period.Microseconds(), p.Tolerance.Microseconds())...).Scan, &started, &late)
	if err != nil {
		return Record{}, nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Record{}, nil, errCommit{err}
	}
	if !started.Valid {
		switch {
		case found && !(p.RerunCrashed && prev.Outcome == Crashed):
			return Record{}, &prev, nil
		case late.Valid:
			return Record{}, nil, j.windowClosed(sl, late.String)
		}
		return Record{}, nil, fmt.Errorf("schedule: job %q slot %s: no run marked and none found", j.name, sl.key)
	}
	return Record{
		Job: j.name, Slot: sl.key, SlotStart: sl.start, Owner: l.Owner(), Token: l.Token(),
		Hostname: host, PID: pid, Start: started.Time, Outcome: Running,
	}, nil, nil
}

// windowClosed is the error of a Start too late for its period slot: why
// is markSQL's reason, "window" or "later".
func (j *Job) windowClosed(sl slot, why string) error {
	reason := "its window closed at " + SlotKey(sl.closes) + " (server clock)"
	if why == "later" {
		reason = "a later slot has run"
	}
	return fmt.Errorf("%w: job %q slot %s not run: %s before this Start (decided at %s) could mark it: "+
		"the replica stalled, or waited for the job", ErrWindowClosed, j.name, sl.key, reason, SlotKey(sl.at))
}
