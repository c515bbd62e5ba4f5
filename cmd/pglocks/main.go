// Command pglocks is the pglocks toolkit from a shell: flock(1) for
// PostgreSQL.
//
//	pglocks [-v] [--dsn URL] COMMAND …   (-v: log the library's events to stderr, Debug and up)
//	pglocks --version | --help
//	pglocks run [-n | -w SECONDS] [-E CODE] [-q] [--lease [--ttl D]] [--kill-after D] NAME -- CMD [ARGS…]
//	pglocks run [-n | -w SECONDS] [-E CODE] [-q] (-s | --max N) NAME -- CMD [ARGS…]
//	pglocks run --once-per PERIOD [--ttl D] [-E CODE] [-q] NAME -- CMD [ARGS…]
//	pglocks status [--json] [--shards] [NAME]
//	pglocks key [--sql] NAME
//	pglocks migrate [--schema S] [--table T] [--run-table T]
//	pglocks break NAME
//	pglocks leader resign [--wait D] NAME
//	pglocks leader handover [--to ID] [--wait D] NAME
//	pglocks doctor [--need FEATURES] [--schema S] [--table T] [--run-table T]
//
// Flags come before NAME. Every --help prints the command's synopsis, its
// flags and the table of exit statuses to stdout. run follows flock(1)'s conventions: -n (fail
// at once when the lock is held: the default), -w SECONDS (plain seconds
// or a duration; an outage of the database is waited through up to the
// bound), -E CODE (the status when the lock is held), -q (no message
// then: cron mails stderr). A CMD that is not found exits 127, one that
// is not executable 126, as shells do (flock(1) uses 69/71, which mean
// other things here).
//
// run --once-per PERIOD runs CMD once per slot of PERIOD by the server's
// clock, on one of the hosts that all run the same line (package
// schedule, job NAME): the others exit 79, silently unless -v. The run
// holds the job's lease as run --lease does, and its outcome (CMD's
// status) is kept in the run history that status shows.
//
// doctor checks a database for pglocks and prints a table: server version,
// primary or standby, the pooler in between and its mode (a probe: does a
// client keep its server session?), whether a session lock survives to the
// next statement and a NOTIFY arrives, the lease table and the privileges
// pglocks needs on it, advisory lock capacity, the settings that matter,
// the clock offset, and which features (session-locks, xact-locks, leases,
// listen, leader) are safe there. It exits 1 when a feature named in
// --need is not safe.
//
// run runs CMD while holding the lock NAME: a session advisory lock on
// KeyOf(NAME) by default, or with --lease a lease renewed in the background
// (every TTL/3, at most every 5s, so that a lease broken with pglocks break
// stops the job within seconds).
// It exits with CMD's status, or:
//
//	1   doctor: a feature named in --need is not safe
//	64  usage error, including a name or --ttl the lock or lease refuses
//	66  break: no lease of that name; leader: no leader, or no such live
//	    candidate
//	69  the database cannot be reached or refused an operation (with
//	    --wait: once the wait ran out)
//	70  the supervisor of the job (see below) was killed; CMD's status is
//	    unknown, and none of the job's processes is left
//	75  the lock is held elsewhere (and --wait, if given, ran out); -E sets it
//	76  the lock was lost while the job ran (or its trust deadline passed:
//	    pglocks was stopped or hung); every process of the job was sent
//	    SIGTERM, then SIGKILL at --kill-after, and none is left
//	78  the database is not set up: no lease or run table (run pglocks
//	    migrate), a missing privilege, a read-only server
//	79  run --once-per: the slot was run, or is being run, elsewhere; -E
//	    sets it
//	126 CMD is not executable; 127 CMD is not found
//	128+N  CMD was killed by signal N
//
// The job is CMD and every process it starts, in CMD's process group or
// not. On Linux no process of the job outlives the lock:
//
//   - when the lock is lost, every process of the job gets SIGTERM at once
//     and SIGKILL at --kill-after; pglocks exits 76 once none is left;
//   - when CMD exits, what it left running gets the same, and the lock is
//     released only once no process of the job is left: the job never
//     runs unlocked;
//   - should pglocks be killed outright (SIGKILL, a crash), alone or with
//     its whole process group (kill -9 -PGID; timeout -k once its grace
//     is over), every process of the job is SIGKILLed at once
//     (TestRunStopsTheWholeJob: the job's worker died at most 64 ms after
//     the kill -9 over 120 trials on a loaded 2-core machine, median
//     1.5–10 ms). An advisory lock is freed by the server only once the
//     job is dead (TestRunKilledKeepsLockUntilJobDead, 20 trials with 103
//     processes in the job: a session waiting for the lock got it 3 ms or
//     more, median 4 ms, after the worker's last write; the worker died
//     at most 23 ms after the kill); a lease at the end of its TTL;
//   - should pglocks stop (SIGSTOP, a Ctrl-Z left for long) or hang, it
//     renews nothing, and the lock is freed in time: a lease at the end of
//     its TTL, an advisory lock when the server ends the silent session
//     (after 10 s, 8 s if the network is cut). The job is stopped before
//     then, as on a loss: with a lease at its trust deadline (TTL − TTL/10
//     after the send of its last renewal), with an advisory lock 7 s after
//     its session last answered; pglocks exits 76 once it runs again
//     (TestRunStoppedPglocks, SIGSTOP of pglocks, 10 trials each: with a
//     2s lease the worker's last write came 196 ms or more before the
//     lease expired, with an advisory lock 2.99 s or more before another
//     session got it). A job that ignores SIGTERM has --kill-after more.
//
// pglocks exits 76 too when the lock is found lost only as CMD exits (the
// release says so), and 70 when its supervisor (below) was killed alone:
// then CMD's own status is unknown, and every process left of the job was
// SIGKILLed before the lock was released.
//
// To that end pglocks runs CMD under a supervising child, this binary
// re-executed as pglocks-supervisor (an internal mode, not a command;
// from /proc/self/exe, or the path pglocks was started by when there is
// no /proc). The supervisor leads a process group of its own, puts CMD in
// another and is the job's subreaper, so that a process that leaves the
// group (setsid) and whose parent exits (a double fork) is still its
// descendant, found by walking /proc. pglocks sends it, over a socket
// whose EOF tells it that pglocks is gone, the signals to forward, the
// loss of the lock, and the lock's trust deadline on the system's
// monotonic clock after each renewal (a lease) or answered ping (an
// advisory lock): should the deadline pass, pglocks is stopped or hung,
// and the supervisor stops the job (a dead-man's switch). With an
// advisory lock the supervisor also holds a duplicate of the lock
// session's socket, which it never uses: the server sees the session end
// only once the supervisor has exited, after the job. Should the
// supervisor alone be killed, CMD gets SIGKILL from the kernel and
// pglocks, a subreaper too, kills the rest before it releases the lock.
// Not covered: processes handed to another service (systemd-run, at, a
// daemon the job talks to); pglocks and its supervisor both killed (pkill
// -9 pglocks): then CMD is SIGKILLed, but what it started runs on; the
// supervisor stopped (SIGSTOP); a machine that sleeps (suspend), as the
// monotonic clock stops meanwhile.
//
// SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to pglocks are forwarded to
// CMD's process group, with a SIGCONT so that a stopped CMD acts on them;
// a signal ignored when pglocks starts (nohup's SIGHUP, a background
// job's SIGINT) is not forwarded, and CMD inherits it ignored. When stdin
// is the controlling terminal, CMD's group gets the terminal if pglocks is
// in its foreground: Ctrl-C and Ctrl-\ reach CMD, it reads the terminal,
// and Ctrl-Z stops it and pglocks. A CMD that stops otherwise on the
// terminal (reading it, or writing it with stty tostop, from the
// background: pglocks run … &) stops pglocks' process group too, so that
// the shell sees the job stop; fg or bg continues pglocks, which
// continues CMD, with the terminal after fg.
//
// Elsewhere than Linux it is best effort: CMD leads a process group of its
// own, signalled as a whole (unless stdin is a terminal: then CMD stays in
// pglocks' group, and only CMD is signalled); a process that leaves the
// group is not found, and should pglocks be killed outright, or stopped,
// the job runs on without the lock.
//
// The database is --dsn (before or after the command), else DATABASE_URL,
// else libpq's PG* environment variables (PGHOST, PGPORT, PGUSER,
// PGDATABASE, PGPASSWORD, …). Without -v the library's own log is
// discarded: pglocks says what matters in one line.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/schedule"
)

// Exit statuses of pglocks itself; see the package doc.
const (
	exitUsage       = 64  // EX_USAGE
	exitNotFound    = 66  // EX_NOINPUT
	exitUnavailable = 69  // EX_UNAVAILABLE
	exitSoftware    = 70  // EX_SOFTWARE
	exitBusy        = 75  // EX_TEMPFAIL
	exitLost        = 76  // EX_PROTOCOL
	exitConfig      = 78  // EX_CONFIG: not set up (no table, privilege, read-only)
	exitTaken       = 79  // run --once-per: the slot was run elsewhere
	exitNoExec      = 126 // CMD not executable, as shells
	exitNoCommand   = 127 // CMD not found, as shells
)

// exitError carries an exit status and a one-line message.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func fail(code int, format string, args ...any) error {
	return &exitError{code: code, msg: fmt.Sprintf(format, args...)}
}

// exitCode is a status to exit with, without a message.
type exitCode int

func (c exitCode) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

func main() {
	if code, ok := superviseIfAsked(); ok { // pglocks run's own child
		os.Exit(code)
	}
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a command line and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	ctx, args, code, done := globalOptions(ctx, args, stdout, stderr)
	switch {
	case done:
		return code
	case len(args) == 0:
		fmt.Fprint(stderr, usage)
		return exitUsage
	case args[0] == "help":
		fmt.Fprint(stdout, usage, exitTable)
		return 0
	}
	cmds := map[string]func(context.Context, []string, io.Writer, io.Writer) error{
		"run":     cmdRun,
		"status":  cmdStatus,
		"key":     cmdKey,
		"migrate": cmdMigrate,
		"break":   cmdBreak,
		"doctor":  cmdDoctor,
		"leader":  cmdLeader,
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "pglocks: unknown command %q\n%s", args[0], usage)
		return exitUsage
	}
	err := cmd(ctx, args[1:], stdout, stderr)
	var ee *exitError
	var ec exitCode
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ec):
		return int(ec)
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ee):
		fmt.Fprintln(stderr, "pglocks: "+oneLine(ee.msg))
		return ee.code
	default:
		msg := oneLine(err.Error())
		if noTable(err) && !strings.Contains(msg, "pglocks migrate") {
			msg += " (run pglocks migrate)"
		}
		fmt.Fprintln(stderr, "pglocks: "+msg)
		return statusOfErr(err)
	}
}

// statusOfErr is the exit status for an error of the library: bad input
// is a usage error, an unknown lease has its own status, so has a database
// not set up for pglocks (a missing table or privilege, a read-only
// server); anything else means the database could not be reached or
// refused.
func statusOfErr(err error) int {
	switch {
	case errors.Is(err, pglocks.ErrInvalidKey), errors.Is(err, lease.ErrInvalidTTL),
		errors.Is(err, lease.ErrInvalidConfig), errors.Is(err, schedule.ErrInvalid):
		return exitUsage
	case errors.Is(err, lease.ErrNotFound):
		return exitNotFound
	case errors.Is(err, lease.ErrNoTable), errors.Is(err, lease.ErrNoPrivilege), errors.Is(err, lease.ErrReadOnly),
		errors.Is(err, schedule.ErrNoTable):
		return exitConfig
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42501" || pgErr.Code == "25006") {
		return exitConfig // a run table's, say: undefined table, no privilege, read-only
	}
	return exitUnavailable
}

// oneLine folds s onto one line, without a leading "pglocks: " (the
// caller adds it).
func oneLine(s string) string {
	return strings.TrimPrefix(strings.Join(strings.Fields(s), " "), "pglocks: ")
}

// connect opens a pool on --dsn, DATABASE_URL or the PG* variables, and
// checks that the server answers. Errors name the host and port.
func connect(ctx context.Context, dsn string, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	pool, _, err := dialPool(ctx, dsn, configure...)
	return pool, err
}

// connectUntil is connect that, while the server cannot be reached (down,
// restarting, starting up, out of connections), tries again with backoff
// until deadline: --wait waits through an outage up to its bound.
func connectUntil(ctx context.Context, dsn string, deadline time.Time) (*pgxpool.Pool, error) {
	backoff := 100 * time.Millisecond
	for {
		actx, cancel := context.WithDeadline(ctx, deadline) // a silent server must not outlast the wait
		pool, transient, err := dialPool(actx, dsn)
		cancel()
		if err == nil || !transient || !time.Now().Before(deadline) {
			return pool, err
		}
		t := time.NewTimer(min(backoff, time.Until(deadline))) // one last attempt at the deadline
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// defaultConnectTimeout bounds a connection attempt whose DSN sets no
// connect_timeout: a server that accepts and never answers must not hang a
// cron job.
const defaultConnectTimeout = 10 * time.Second

// dialPool is connect, and says whether its error may pass by itself.
func dialPool(ctx context.Context, dsn string, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, bool, error) {
	if dsn == "" {
		dsn = os.Getenv("DATABASE_URL")
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, false, fail(exitUsage, "bad connection string: %v", err)
	}
	for _, f := range configure {
		f(cfg)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
	}
	where := fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, false, fail(exitUnavailable, "connect to %s: %v", where, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		var pgErr *pgconn.PgError
		var netErr *net.OpError
		switch {
		case errors.As(err, &pgErr):
			// starting up, shutting down, too many connections
			transient := pgErr.Code == "57P03" || pgErr.Code == "57P01" || pgErr.Code == "53300"
			return nil, transient, fail(exitUnavailable, "connect to %s: %s (SQLSTATE %s)", where, pgErr.Message, pgErr.Code)
		case errors.As(err, &netErr):
			return nil, true, fail(exitUnavailable, "connect to %s: %v", where, netErr.Err)
		}
		return nil, true, fail(exitUnavailable, "connect to %s: %v", where, err)
	}
	return pool, false, nil
}
