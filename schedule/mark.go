package schedule

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pglocks/pglocks/internal/outcome"
	"github.com/pglocks/pglocks/lease"
)

// mark records the run of sl under lease l, in a transaction guarded by l:
// it commits only while l holds the job, and no other owner can take the
// job before it ends. It returns the Run, or a TakenError when the slot
// turned out to be taken (a replica that read the slot as free before
// another ran it), or an error; on error or TakenError the caller releases
// l. Older runs still recorded as running are marked crashed on the way
// (l's token is higher: their leases ended).
//
// If the commit's outcome is unknown, the run may be recorded as started:
// it is not started, and the record, still running once l is released,
// counts as crashed — a slot missed, never run twice (with RerunCrashed,
// another Start may run it).
func (j *Job) mark(ctx context.Context, l *lease.Lease, sl slot) (*Run, error) {
	rec, taken, err := j.markTx(ctx, l, sl)
	if err != nil {
		if outcome.Of(err) == outcome.Unknown {
			return nil, fmt.Errorf("schedule: job %q slot %s: mark the run: outcome unknown (the slot may show a run "+
				"that never started, counted as crashed; the job was not run): %w", j.name, sl.key, err)
		}
		return nil, fmt.Errorf("schedule: job %q slot %s: mark the run: %w", j.name, sl.key, err)
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
	var slotStart pgtype.Timestamptz
	if !sl.start.IsZero() {
		slotStart = pgtype.Timestamptz{Time: sl.start, Valid: true}
	}
	host, pid := cfg.Store.Config().Hostname, cfg.Store.Config().PID
	var started pgtype.Timestamptz
	prev, found, err := scanRecord(j.name, tx.QueryRow(ctx, j.r.q.mark, j.r.args(j.name, l.Token(), sl.key, slotStart,
		pgtype.UUID{Bytes: l.Owner(), Valid: true}, host, int32(pid), j.policy.RerunCrashed,
		j.policy.AtLeast.Microseconds(), int32(cfg.History))...).Scan, &started)
	if err != nil {
		return Record{}, nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Record{}, nil, err
	}
	if !started.Valid {
		if !found { // cannot be: nothing inserted means a run took the slot
			return Record{}, nil, fmt.Errorf("schedule: job %q slot %s: no run marked and none found", j.name, sl.key)
		}
		return Record{}, &prev, nil
	}
	return Record{
		Job: j.name, Slot: sl.key, SlotStart: sl.start, Owner: l.Owner(), Token: l.Token(),
		Hostname: host, PID: pid, Start: started.Time, Outcome: Running,
	}, nil, nil
}
