package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/schedule"
)

// takeSlot starts the run of the job o.name for the slot of this moment
// by the server's clock (package schedule, Policy{Period: --once-per}):
// the run holds the job's lease, renewed in the background, and its end
// records CMD's outcome in the run history. A slot run elsewhere is 79,
// silent unless -v; a slot whose window closed while another slot's run
// held the job is 75.
func takeSlot(ctx context.Context, pool *pgxpool.Pool, o runOpts, stderr io.Writer) (*held, error) {
	store, runner, err := o.tables.runner(ctx, pool, o.ttl)
	if err != nil {
		return nil, err
	}
	closeStore := func(ctx context.Context) { _ = store.Close(ctx) }
	job, err := runner.Job(o.name, schedule.Policy{Period: o.oncePer, TTL: o.ttl})
	if err != nil {
		closeStore(context.Background())
		return nil, err
	}
	r, err := job.Start(ctx)
	var taken *schedule.TakenError
	switch {
	case errors.As(err, &taken):
		closeStore(context.Background())
		if verbose(ctx) {
			return nil, fail(exitTaken, "%v", taken)
		}
		return nil, exitCode(exitTaken)
	case errors.Is(err, schedule.ErrBusy):
		closeStore(context.Background())
		return nil, fail(exitBusy, "%v", err)
	case err != nil:
		closeStore(context.Background())
		return nil, err
	}
	ls := r.Lease()
	// CMD learns its slot and its fencing token.
	_ = os.Setenv("PGLOCKS_SLOT", r.Record().Slot)
	_ = os.Setenv("PGLOCKS_TOKEN", strconv.FormatInt(ls.Token(), 10))
	var cmdErr error
	ended := false
	end := func(ctx context.Context, err error) error {
		ended = true
		rec, eerr := r.End(ctx, err)
		if eerr != nil {
			fmt.Fprintf(stderr, "pglocks: record the end of %s's run (%s): %v\n", o.name, rec.Outcome, eerr)
		}
		if rec.Outcome == schedule.Lost {
			return lease.ErrNotHeld
		}
		return nil
	}
	return &held{
		lost:    ls.Lost(),
		err:     ls.Err,
		release: func(ctx context.Context) error { return end(ctx, cmdErr) },
		close: func(ctx context.Context) {
			if !ended { // the lease was lost: End records it so
				_ = end(ctx, lease.ErrLost)
			}
			closeStore(ctx)
		},
		trusted: ls.TrustedUntil,
		notHeld: func(err error) bool { return errors.Is(err, lease.ErrNotHeld) },
		result:  func(err error) { cmdErr = err },
	}, nil
}
