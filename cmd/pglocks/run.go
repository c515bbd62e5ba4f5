package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
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
	// trusted returns the local deadline until which the lock is held
	// for sure (the supervisor stops the job if it is not extended).
	trusted func() time.Time
	// session returns a duplicate of the socket of the lock's session
	// (nil for a lease, whose TTL outlives pglocks anyway).
	session func() (*os.File, error)
	// notHeld reports whether an error of release says the lock was lost
	// before.
	notHeld func(error) bool
	// result, if set, is told CMD's exit before the release (a
	// scheduled run records it).
	result func(cmdErr error)
}

const runHelp = `usage: pglocks run [-n | -w SECONDS] [-E CODE] [-q] [--lease [--ttl D]] NAME -- CMD [ARGS...]
       pglocks run [-n | -w SECONDS] [-E CODE] [-q] (-s | --max N) NAME -- CMD [ARGS...]
       pglocks run --once-per PERIOD [--ttl D] [-E CODE] [-q] NAME -- CMD [ARGS...]

Runs CMD while holding the lock NAME: a session advisory lock, or with
--lease a lease renewed in the background. Like flock(1): without -w it
fails at once when NAME is held elsewhere (-n, the default), exiting 75
(-E sets the code) with one line on stderr (none with -q: cron mails what
a job writes to stderr). -w waits for the lock, and through an outage of
the database, up to its bound. A busy message names the holder: for an
advisory lock the server backend pid of its session (a PostgreSQL
process: do not kill it, it would only free the lock), for a lease the
holder process pid on its host.

-s (--shared, as flock -s) holds NAME's advisory lock shared: shared runs
of NAME run together, and a plain (exclusive) run of NAME waits for, or
is refused by, all of them. --max N runs CMD only while fewer than N runs
of NAME (with --max, on every host) run: it holds one permit of the
advisory semaphore NAME (package advisory, Semaphore: slot locks
hashtextextended('pglocks.sem:NAME:' || i, 0), i < N), freed with its
session like any advisory lock. The count is --max, not -n, because -n is
flock's --nonblock here too. Runs that give different N are bounded by
the largest; a plain run of NAME is a different lock.

With --once-per PERIOD, put the same line on every host (crontab): for
each slot of PERIOD by the database server's clock (slots aligned to
multiples of PERIOD since the Unix epoch, UTC; a host up to
min(5s, PERIOD/4) early still gets the coming slot) exactly one host runs
CMD, holding the job's lease as --lease does; the others exit 79 (-E sets
it) and print nothing (with -v, who ran it). The outcome (CMD's status:
succeeded, failed; lost, crashed) is kept in the run history shown by
pglocks status. CMD gets PGLOCKS_SLOT and PGLOCKS_TOKEN (its fencing
token). Needs pglocks migrate.

Exits with CMD's status (128+N if a signal N killed it), 127 if CMD is not
found, 126 if not executable, 76 if the lock was lost while the job ran,
70 if pglocks' supervisor of the job was killed.

The job is CMD and every process it starts, in its process group or not
(setsid, double fork). On Linux no process of the job outlives the lock:
  - lock lost: all get SIGTERM at once, SIGKILL at --kill-after; pglocks
    exits 76 once none is left;
  - CMD exits: what it left running gets the same, and the lock is
    released once none is left: the job never runs unlocked;
  - pglocks SIGKILLed, alone or with its process group (timeout -k): all
    are SIGKILLed at once (within 64 ms in our tests, usually a few ms),
    and the server frees an advisory lock only once none is left;
  - pglocks stopped or hung: all get SIGTERM before the lock can be freed
    (at a lease's trust deadline; 7s after an advisory lock's session last
    answered), SIGKILL at --kill-after; pglocks exits 76 once it runs.
SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to pglocks go to CMD's process
group, unless ignored when pglocks started (nohup); on a terminal, CMD's
group has the terminal. Processes handed to a service (systemd-run, at, a
daemon) are not the job's. Elsewhere than Linux, CMD's process group only,
and not after a SIGKILL or SIGSTOP of pglocks.
`

// runOpts is what pglocks run was asked.
type runOpts struct {
	dsn       string
	name      string
	argv      []string
	wait      time.Duration
	useLease  bool
	ttl       time.Duration
	killAfter time.Duration
	oncePer   time.Duration
	skipCode  int  // -E: the status when NAME is held, or the slot taken; -1: 75, 79
	quiet     bool // -q: no message when so
	shared    bool // -s: a shared advisory lock
	max       int  // --max: one permit of the semaphore NAME of this limit; 0: none
	tables    tables
}

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseRun(ctx, args, stdout, stderr)
	if err != nil {
		return err
	}
	if err := lookCommand(o.argv[0]); err != nil {
		return err
	}
	deadline := time.Now().Add(o.wait)
	var pool *pgxpool.Pool
	if o.wait > 0 {
		pool, err = connectUntil(ctx, o.dsn, deadline)
	} else {
		pool, err = connect(ctx, o.dsn)
	}
	if err != nil {
		return err
	}
	defer pool.Close()

	var h *held
	switch {
	case o.oncePer > 0:
		h, err = takeSlot(ctx, pool, o, stderr)
	case o.useLease:
		h, err = takeLease(ctx, pool, o, deadline)
	case o.max > 0:
		h, err = takePermit(ctx, pool, o, deadline)
	default:
		h, err = takeLock(ctx, pool, o.name, o.shared, o.wait, deadline)
	}
	if err != nil {
		return skipped(err, o)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h.close(cctx)
	}()
	return runHolding(h, o.argv, o.killAfter, stderr)
}

// skipped turns a skip — NAME held elsewhere (75), the slot run elsewhere
// (79) — into -E's status if given (with --once-per, 79 only), without its
// message with -q.
func skipped(err error, o runOpts) error {
	var ee *exitError
	var ec exitCode
	code, msg := 0, ""
	switch {
	case errors.As(err, &ee) && (ee.code == exitBusy || ee.code == exitTaken):
		code, msg = ee.code, ee.msg
	case errors.As(err, &ec) && (ec == exitBusy || ec == exitTaken):
		code = int(ec)
	default:
		return err
	}
	// With --once-per, -E remaps only "run elsewhere" (79): a 75 there means
	// nobody ran the slot (the job was held by a run of another slot until
	// this slot's window closed), which must stay loud.
	if o.skipCode >= 0 && (o.oncePer == 0 || code == exitTaken) {
		code = o.skipCode
	}
	if o.quiet || msg == "" {
		return exitCode(code)
	}
	return fail(code, "%s", msg)
}

// parseRun parses pglocks run's command line.
func parseRun(ctx context.Context, args []string, stdout, stderr io.Writer) (runOpts, error) {
	var o runOpts
	fs, dsn := newFlags(ctx, "run", runHelp, stdout, stderr, true)
	var wait waitFlag
	var nonblock bool
	fs.BoolVar(&nonblock, "n", false, "fail at once if NAME is held elsewhere (the default)")
	fs.BoolVar(&nonblock, "nonblock", false, "the same as -n")
	fs.Var(&wait, "w", "wait this long for the lock, and through an outage: seconds (30) or a duration (30s, 2m)")
	fs.Var(&wait, "wait", "the same as -w")
	fs.IntVar(&o.skipCode, "E", -1, "exit with this status when NAME is held (default 75), or with --once-per the slot was run elsewhere (default 79; a 75 stays 75 there)")
	fs.IntVar(&o.skipCode, "conflict-exit-code", -1, "the same as -E")
	fs.BoolVar(&o.quiet, "q", false, "print nothing when NAME is held elsewhere (cron mails stderr)")
	fs.BoolVar(&o.quiet, "quiet", false, "the same as -q")
	fs.BoolVar(&o.useLease, "lease", false, "hold a lease (renewed in the background) instead of a session advisory lock")
	fs.DurationVar(&o.ttl, "ttl", 30*time.Second, "the lease's TTL, with --lease or --once-per")
	fs.DurationVar(&o.killAfter, "kill-after", 10*time.Second, "SIGKILL what is left of the job this long after SIGTERM (on a loss, or after CMD exits)")
	fs.DurationVar(&o.oncePer, "once-per", 0, "run CMD once per slot of this period by the server's clock, on one host of all that ask")
	fs.BoolVar(&o.shared, "s", false, "hold NAME's advisory lock shared: shared runs run together, an exclusive run excludes them")
	fs.BoolVar(&o.shared, "shared", false, "the same as -s")
	fs.IntVar(&o.max, "max", 0, "run while fewer than this many runs of NAME with --max run: hold a permit of the advisory semaphore NAME")
	o.tables.add(fs)
	if err := parse(fs, args); err != nil {
		return o, err
	}
	if err := checkModes(o, fs); err != nil {
		return o, err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	rest := fs.Args()
	switch {
	case len(rest) < 3 || rest[1] != "--":
		return o, fail(exitUsage, "usage: pglocks run [flags] NAME -- CMD [ARGS...] (see pglocks run --help)")
	case (given["n"] || given["nonblock"]) && (given["w"] || given["wait"]):
		return o, fail(exitUsage, "run: -n (fail at once) and -w (wait) exclude each other")
	case given["ttl"] && !o.useLease && o.oncePer == 0:
		return o, fail(exitUsage, "run: --ttl is the lease's: give --lease too (or --once-per)")
	case o.oncePer < 0 || o.oncePer > 0 && (given["w"] || given["wait"]):
		return o, fail(exitUsage, "run: --once-per must be positive, and takes no --wait (a slot is run now or not)")
	case o.ttl <= 0 || o.killAfter < 0:
		return o, fail(exitUsage, "run: --kill-after must not be negative, --ttl must be positive")
	case o.skipCode > 255 || o.skipCode < -1:
		return o, fail(exitUsage, "run: -E must be an exit status, 0 to 255")
	}
	o.dsn, o.name, o.argv, o.wait = *dsn, rest[0], rest[2:], wait.d
	if err := pglocks.ValidateName(o.name); err != nil {
		return o, fail(exitUsage, "lock name: %v", err)
	}
	return o, nil
}

// lookCommand checks that CMD can be started before any lock is taken:
// 127 if it is not found, 126 if it is not executable, as shells say.
func lookCommand(cmd string) error {
	_, err := exec.LookPath(cmd)
	return startError(cmd, err)
}

// startError is the error, with the shells' status, of a CMD that could
// not be started; nil for nil.
func startError(cmd string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return fail(exitNoCommand, "%s: command not found", cmd)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.ENOEXEC), errors.Is(err, syscall.EISDIR):
		return fail(exitNoExec, "%s: not executable (%v)", cmd, err)
	}
	return fail(exitNoExec, "start %s: %v", cmd, err)
}

// takeLock takes the session advisory lock KeyOf(name), shared with -s.
// With wait, it waits until deadline (wait after pglocks started).
func takeLock(ctx context.Context, pool *pgxpool.Pool, name string, shared bool, wait time.Duration, deadline time.Time) (*held, error) {
	cfg := lockConfig(ctx)
	locker, err := advisory.New(pool, cfg)
	if err != nil {
		return nil, err
	}
	closeLocker := func(ctx context.Context) { _ = locker.Close(ctx) }
	key := pglocks.KeyOf(name)
	var lk *advisory.Lock
	if wait > 0 {
		wctx, cancel := context.WithDeadline(ctx, deadline)
		if shared {
			lk, err = locker.RLock(wctx, key)
		} else {
			lk, err = locker.Lock(wctx, key)
		}
		cancel()
		if errors.Is(err, context.DeadlineExceeded) && !unreachable(err) {
			closeLocker(context.Background())
			return nil, fail(exitBusy, "%s is held elsewhere; gave up after %v", name, wait)
		}
	} else {
		if shared {
			lk, err = locker.TryRLock(ctx, key)
		} else {
			lk, err = locker.TryLock(ctx, key)
		}
		if errors.Is(err, advisory.ErrLocked) {
			msg := name + " is held elsewhere"
			if hs, herr := locker.Holders(ctx, key); herr == nil {
				for _, h := range hs {
					if h.Granted {
						msg += fmt.Sprintf(" (by server backend pid %d, a PostgreSQL process, of %q, since %s)", h.PID, h.ApplicationName, h.Since.Format(time.RFC3339))
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
	return advisoryHeld(cfg, closeLocker, lk, lk.Lost(), lk.Err, lk.Unlock, lk.VerifiedAt), nil
}

// lockConfig is pglocks run's advisory Config: the defaults, spelled out
// because the trust deadline of a lock derives from them (serverHold).
func lockConfig(ctx context.Context) advisory.Config {
	return advisory.Config{
		ApplicationName:    "pglocks run",
		Logger:             loggerOf(ctx),
		TCPUserTimeout:     advisory.DefaultTCPUserTimeout,
		KeepalivesIdle:     advisory.DefaultKeepalivesIdle,
		KeepalivesInterval: advisory.DefaultKeepalivesInterval,
		KeepalivesCount:    advisory.DefaultKeepalivesCount,
	}
}

// serverHold is how long, at least, the server keeps a lock session it
// hears nothing from (its holder stopped, or cut off) before it ends it
// and frees its locks: its idle_session_timeout and tcp_user_timeout
// (TCPUserTimeout), or its TCP keepalives when the network is cut
// (see advisory.Config). A lock's last answered round trip (VerifiedAt)
// plus serverHold is the earliest the server may free it.
func serverHold(c advisory.Config) time.Duration {
	return min(c.TCPUserTimeout, c.KeepalivesIdle+c.KeepalivesInterval*time.Duration(c.KeepalivesCount))
}

// trustMargin is how long before the earliest moment the server may free
// an advisory lock the supervisor stops the job when pglocks has not
// confirmed the lock since (it is stopped or hung): time for the job to
// act on SIGTERM. 8s − 1s with the defaults.
const trustMargin = time.Second

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
// With --wait, it waits until deadline.
func takeLease(ctx context.Context, pool *pgxpool.Pool, o runOpts, deadline time.Time) (*held, error) {
	name, ttl, wait := o.name, o.ttl, o.wait
	store, err := lease.New(pool, o.tables.leaseConfig(ctx, ttl))
	if err != nil {
		return nil, err
	}
	closeStore := func(ctx context.Context) { _ = store.Close(ctx) }
	var ls *lease.Lease
	if wait > 0 {
		wctx, cancel := context.WithDeadline(ctx, deadline)
		ls, err = store.Acquire(wctx, name, ttl, lease.WithKeepAlive())
		cancel()
		if errors.Is(err, context.DeadlineExceeded) && !unreachable(err) {
			closeStore(context.Background())
			return nil, fail(exitBusy, "lease %s is held elsewhere; gave up after %v", name, wait)
		}
	} else {
		ls, err = store.TryAcquire(ctx, name, ttl, lease.WithKeepAlive())
		var he *lease.HeldError
		if errors.As(err, &he) {
			msg := fmt.Sprintf("lease %s is held by %s (token %d) for another %v", name, he.Owner, he.Token, he.ExpiresIn.Round(time.Millisecond))
			if in, gerr := store.Get(ctx, name); gerr == nil && in.Owner == he.Owner {
				msg += fmt.Sprintf(", by holder process pid %d on %s", in.PID, in.Hostname)
			}
			closeStore(context.Background())
			return nil, fail(exitBusy, "%s", msg)
		}
	}
	if err != nil {
		closeStore(context.Background())
		return nil, err
	}
	return &held{
		lost:    ls.Lost(),
		err:     ls.Err,
		release: ls.Release,
		close:   closeStore,
		trusted: ls.TrustedUntil, // send time of the last renewal + TTL − TTL/10
		notHeld: func(err error) bool { return errors.Is(err, lease.ErrNotHeld) },
	}, nil
}
