package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/lease"
)

// held is a lock or lease held for CMD.
type held struct {
	lost    <-chan struct{}
	err     func() error
	release func(context.Context) error
	close   func(context.Context)
}

const runHelp = `usage: pglocks run [flags] NAME -- CMD [ARGS...]

Runs CMD while holding the lock NAME: a session advisory lock, or with
--lease a lease renewed in the background. Exits with CMD's status (128+N
if a signal N killed it), 75 if NAME is held elsewhere, 76 if the lock was
lost while the job ran.

The job is CMD and every process it starts, in its process group or not
(setsid, double fork). On Linux no process of the job outlives the lock:
  - lock lost: all get SIGTERM at once, SIGKILL at --kill-after; pglocks
    exits 76 once none is left;
  - CMD exits: what it left running gets the same, and the lock is
    released once none is left: the job never runs unlocked;
  - pglocks SIGKILLed: all are SIGKILLed at once (within 64 ms in our
    tests, usually a few ms), and the server frees the lock.
SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to pglocks go to CMD's process
group; on a terminal, CMD's group has the terminal. Processes handed to a
service (systemd-run, at, a daemon) are not the job's. Elsewhere than
Linux, CMD's process group only, and not after a SIGKILL of pglocks.

Flags:
`

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, dsn := newFlags("run", stderr, true)
	wait := fs.Duration("wait", 0, "wait this long for the lock when it is held (default: do not wait)")
	useLease := fs.Bool("lease", false, "hold a lease (renewed in the background) instead of a session advisory lock")
	ttl := fs.Duration("ttl", 30*time.Second, "the lease's TTL, with --lease")
	killAfter := fs.Duration("kill-after", 10*time.Second, "SIGKILL what is left of the job this long after SIGTERM (on a loss, or after CMD exits)")
	fs.Usage = func() { fmt.Fprint(stderr, runHelp); fs.PrintDefaults() }
	if err := parse(fs, args); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) < 3 || rest[1] != "--" {
		return fail(exitUsage, "usage: pglocks run [flags] NAME -- CMD [ARGS...]")
	}
	name, argv := rest[0], rest[2:]
	if err := pglocks.ValidateName(name); err != nil {
		return fail(exitUsage, "lock name: %v", err)
	}
	if *wait < 0 || *ttl <= 0 || *killAfter < 0 {
		return fail(exitUsage, "--wait and --kill-after must not be negative, --ttl must be positive")
	}
	pool, err := connect(ctx, *dsn)
	if err != nil {
		return err
	}
	defer pool.Close()

	var h *held
	if *useLease {
		h, err = takeLease(ctx, pool, name, *ttl, *wait)
	} else {
		h, err = takeLock(ctx, pool, name, *wait)
	}
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h.close(cctx)
	}()
	return runHolding(h, argv, *killAfter, stderr)
}

// takeLock takes the session advisory lock KeyOf(name).
func takeLock(ctx context.Context, pool *pgxpool.Pool, name string, wait time.Duration) (*held, error) {
	locker, err := advisory.New(pool, advisory.Config{ApplicationName: "pglocks run", Logger: loggerOf(ctx)})
	if err != nil {
		return nil, err
	}
	closeLocker := func(ctx context.Context) { _ = locker.Close(ctx) }
	key := pglocks.KeyOf(name)
	var lk *advisory.Lock
	if wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, wait)
		lk, err = locker.Lock(wctx, key)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) && !unreachable(err) {
			closeLocker(context.Background())
			return nil, fail(exitBusy, "%s is held elsewhere; gave up after %v", name, wait)
		}
	} else {
		lk, err = locker.TryLock(ctx, key)
		if errors.Is(err, advisory.ErrLocked) {
			msg := name + " is held elsewhere"
			if hs, herr := locker.Holders(ctx, key); herr == nil {
				for _, h := range hs {
					if h.Granted {
						msg += fmt.Sprintf(" (pid %d, %q, since %s)", h.PID, h.ApplicationName, h.Since.Format(time.RFC3339))
						break
					}
				}
			}
			closeLocker(context.Background())
			return nil, fail(exitBusy, "%s", msg)
		}
	}
	if err != nil {
		closeLocker(context.Background())
		return nil, err
	}
	return &held{
		lost:    lk.Lost(),
		err:     lk.Err,
		release: lk.Unlock,
		close:   closeLocker,
	}, nil
}

// unreachable reports whether a wait that ran out was failing to open a
// session (the error names the last cause), rather than waiting for a
// holder: then the status is 69, not 75.
func unreachable(err error) bool {
	var ce *pgconn.ConnectError
	return errors.As(err, &ce)
}

// maxRenewInterval caps the keep-alive's interval, so that a lease taken
// over (pglocks break) stops the job within seconds even with a long --ttl.
const maxRenewInterval = 5 * time.Second

// takeLease acquires the lease name with keep-alive.
func takeLease(ctx context.Context, pool *pgxpool.Pool, name string, ttl, wait time.Duration) (*held, error) {
	store, err := lease.New(pool, lease.Config{Logger: loggerOf(ctx), RenewFraction: min(1.0/3, float64(maxRenewInterval)/float64(ttl))})
	if err != nil {
		return nil, err
	}
	closeStore := func(ctx context.Context) { _ = store.Close(ctx) }
	var ls *lease.Lease
	if wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, wait)
		ls, err = store.Acquire(wctx, name, ttl, lease.WithKeepAlive())
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			closeStore(context.Background())
			return nil, fail(exitBusy, "lease %s is held elsewhere; gave up after %v", name, wait)
		}
	} else {
		ls, err = store.TryAcquire(ctx, name, ttl, lease.WithKeepAlive())
		var he *lease.HeldError
		if errors.As(err, &he) {
			closeStore(context.Background())
			return nil, fail(exitBusy, "lease %s is held by %s (token %d) for another %v", name, he.Owner, he.Token, he.ExpiresIn.Round(time.Millisecond))
		}
	}
	if err != nil {
		closeStore(context.Background())
		return nil, err
	}
	return &held{lost: ls.Lost(), err: ls.Err, release: ls.Release, close: closeStore}, nil
}

// runHolding runs argv as a job (see startJob) while h is held, forwards
// signals to it, stops the whole job if h is lost, and releases h once no
// process of the job is left.
func runHolding(h *held, argv []string, killAfter time.Duration, stderr io.Writer) error {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, os.Interrupt)
	defer signal.Stop(sigs)
	j, err := startJob(argv, killAfter, stderr)
	if err != nil {
		release(h)
		return err
	}
	lost := false
	for {
		select {
		case <-j.done():
			if lost {
				return exitCode(exitLost)
			}
			release(h)
			return statusOf(j.err())
		case s := <-sigs:
			j.forward(s)
		case <-h.lost:
			h.lost = nil
			lost = true
			fmt.Fprintf(stderr, "pglocks: lock lost while %s ran (%v); sending SIGTERM\n", argv[0], h.err())
			j.stop()
		}
	}
}

// job is CMD and the processes it starts, run under the lock.
type job interface {
	// forward sends a signal pglocks received to CMD's process group.
	forward(os.Signal)
	// stop stops every process of the job: SIGTERM now, SIGKILL at
	// --kill-after.
	stop()
	// done is closed once no process of the job is left.
	done() <-chan struct{}
	// err is CMD's exit, for statusOf, once done is closed.
	err() error
}

func release(h *held) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = h.release(ctx)
}

// statusOf turns CMD's exit into pglocks' exit status.
func statusOf(err error) error {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		if err != nil {
			return err
		}
		return nil
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitCode(128 + int(ws.Signal()))
	}
	return exitCode(ee.ExitCode())
}
