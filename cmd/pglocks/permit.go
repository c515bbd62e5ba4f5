package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/internal/sessionfd"
)

// checkModes refuses the combinations of -s and --max with the other ways
// of holding NAME.
func checkModes(o runOpts, fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	switch {
	case given["max"] && (o.max < 1 || o.max > advisory.MaxLimit):
		return fail(exitUsage, "run: --max must be 1 to %d", advisory.MaxLimit)
	case o.shared && o.max > 0:
		return fail(exitUsage, "run: -s (shared) and --max exclude each other")
	case (o.shared || o.max > 0) && (o.useLease || o.oncePer > 0):
		return fail(exitUsage, "run: -s and --max hold advisory locks: not with --lease or --once-per")
	}
	return nil
}

// takePermit takes one permit of the advisory semaphore o.name of limit
// o.max. With a wait, it waits until deadline.
func takePermit(ctx context.Context, pool *pgxpool.Pool, o runOpts, deadline time.Time) (*held, error) {
	cfg := lockConfig(ctx)
	locker, err := advisory.New(pool, cfg)
	if err != nil {
		return nil, err
	}
	closeLocker := func(ctx context.Context) { _ = locker.Close(ctx) }
	sem, err := locker.Semaphore(o.name, o.max)
	if err != nil {
		closeLocker(context.Background())
		return nil, fail(exitUsage, "%v", err)
	}
	var p *advisory.Permits
	if o.wait > 0 {
		wctx, cancel := context.WithDeadline(ctx, deadline)
		p, err = sem.Acquire(wctx, 1)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) && !unreachable(err) {
			closeLocker(context.Background())
			return nil, fail(exitBusy, "%s: all %d permits are held; gave up after %v", o.name, o.max, o.wait)
		}
	} else {
		p, err = sem.TryAcquire(ctx, 1)
		if errors.Is(err, advisory.ErrLocked) {
			msg := fmt.Sprintf("%s: all %d permits are held", o.name, o.max)
			if ps, perr := sem.Holders(ctx); perr == nil {
				msg += fmt.Sprintf(" (%d held, by server backend pids", len(ps))
				for _, h := range ps {
					msg += fmt.Sprintf(" %d", h.PID)
				}
				msg += ")"
			}
			closeLocker(context.Background())
			return nil, fail(exitBusy, "%s", msg)
		}
	}
	if err != nil {
		closeLocker(context.Background())
		return nil, err
	}
	return advisoryHeld(cfg, closeLocker, p, p.Lost(), p.Err, p.Release, p.VerifiedAt), nil
}

// advisoryHeld is the held of an advisory lock (or permits) v, on a
// locker with cfg that closeLocker closes.
func advisoryHeld(cfg advisory.Config, closeLocker func(context.Context), v any, lost <-chan struct{}, errf func() error,
	release func(context.Context) error, verifiedAt func() time.Time) *held {
	trust := serverHold(cfg) - trustMargin
	h := &held{
		lost:    lost,
		err:     errf,
		release: release,
		close:   closeLocker,
		trusted: func() time.Time { return verifiedAt().Add(trust) },
		// An unlock that fails because the session died says the lock
		// was lost (Err); one the server refused leaves it held.
		notHeld: func(err error) bool { return errors.Is(err, advisory.ErrNotHeld) || errf() != nil },
	}
	if sessionfd.File != nil { // Linux
		h.session = func() (*os.File, error) { return sessionfd.File(v) }
	}
	return h
}
