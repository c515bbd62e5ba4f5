package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/internal/sessionfd"
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
}

const runHelp = `usage: pglocks run [flags] NAME -- CMD [ARGS...]

Runs CMD while holding the lock NAME: a session advisory lock, or with
--lease a lease renewed in the background. Exits with CMD's status (128+N
if a signal N killed it), 75 if NAME is held elsewhere, 76 if the lock was
lost while the job ran, 70 if pglocks' supervisor of the job was killed.

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
	cfg := lockConfig(ctx)
	locker, err := advisory.New(pool, cfg)
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
	trust := serverHold(cfg) - trustMargin
	h := &held{
		lost:    lk.Lost(),
		err:     lk.Err,
		release: lk.Unlock,
		close:   closeLocker,
		trusted: func() time.Time { return lk.VerifiedAt().Add(trust) },
		// An unlock that fails because the session died says the lock
		// was lost (Err); one the server refused leaves it held.
		notHeld: func(err error) bool { return errors.Is(err, advisory.ErrNotHeld) || lk.Err() != nil },
	}
	if sessionfd.File != nil { // Linux
		h.session = func() (*os.File, error) { return sessionfd.File(lk) }
	}
	return h, nil
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
	return &held{
		lost:    ls.Lost(),
		err:     ls.Err,
		release: ls.Release,
		close:   closeStore,
		trusted: ls.TrustedUntil, // send time of the last renewal + TTL − TTL/10
		notHeld: func(err error) bool { return errors.Is(err, lease.ErrNotHeld) },
	}, nil
}
