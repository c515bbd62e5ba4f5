// Command pglocks is the pglocks toolkit from a shell: flock(1) for
// PostgreSQL.
//
//	pglocks [-v] COMMAND …   (-v: log the library's events to stderr, Debug and up)
//	pglocks run [--wait D] [--lease] [--ttl D] [--kill-after D] NAME -- CMD [ARGS…]
//	pglocks status [--json] [NAME]
//	pglocks key [--sql] NAME
//	pglocks migrate
//	pglocks break NAME
//	pglocks doctor [--need FEATURES] [--schema S] [--table T]
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
// stops CMD within seconds).
// It exits with CMD's status, or:
//
//	64  usage error, including a name or --ttl the lock or lease refuses
//	66  break: no lease of that name
//	69  the database cannot be reached or refused an operation
//	75  the lock is held elsewhere (and --wait, if given, ran out)
//	76  the lock was lost while CMD ran; CMD was sent SIGTERM, then SIGKILL
//	    after --kill-after
//	128+N  CMD was killed by signal N
//
// SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded to CMD (SIGINT only when
// stdin is not a terminal: a terminal sends it to CMD itself), and the lock
// is released when CMD exits. Should pglocks itself be killed outright, its
// lock is freed by the server and, on Linux, CMD gets SIGTERM from the
// kernel: it never runs on believing it holds the lock.
//
// The database is --dsn, else DATABASE_URL, else libpq's PG* environment
// variables (PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD, …).
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

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/lease"
)

// Exit statuses of pglocks itself; see the package doc.
const (
	exitUsage       = 64
	exitNotFound    = 66
	exitUnavailable = 69
	exitBusy        = 75
	exitLost        = 76
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

const usage = `usage: pglocks [-v] COMMAND ... (-v logs the library's events to stderr)
  pglocks run [--wait D] [--lease] [--ttl D] [--kill-after D] NAME -- CMD [ARGS...]
  pglocks status [--json] [NAME]
  pglocks key [--sql] NAME
  pglocks migrate
  pglocks break NAME
  pglocks doctor [--need FEATURES] [--schema S] [--table T]
Every command but key takes --dsn (default: DATABASE_URL, else libpq PG* variables).
`

// run dispatches a command line and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	ctx, args = verbosity(ctx, args, stderr)
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return exitUsage
		}
		return 0
	}
	cmds := map[string]func(context.Context, []string, io.Writer, io.Writer) error{
		"run":     cmdRun,
		"status":  cmdStatus,
		"key":     cmdKey,
		"migrate": cmdMigrate,
		"break":   cmdBreak,
		"doctor":  cmdDoctor,
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "pglocks: unknown command %q\n%s", args[0], usage)
		return exitUsage
	}
	err := cmd(ctx, args[1:], stdout, stderr)
	var ee *exitError
	var code exitCode
	switch {
	case err == nil:
		return 0
	case errors.As(err, &code):
		return int(code)
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ee):
		fmt.Fprintln(stderr, "pglocks: "+oneLine(ee.msg))
		return ee.code
	default:
		fmt.Fprintln(stderr, "pglocks: "+oneLine(err.Error()))
		return statusOfErr(err)
	}
}

// statusOfErr is the exit status for an error of the library: bad input
// is a usage error, an unknown lease has its own status, anything else
// means the database could not be reached or refused.
func statusOfErr(err error) int {
	switch {
	case errors.Is(err, pglocks.ErrInvalidKey), errors.Is(err, lease.ErrInvalidTTL),
		errors.Is(err, lease.ErrInvalidConfig):
		return exitUsage
	case errors.Is(err, lease.ErrNotFound):
		return exitNotFound
	}
	return exitUnavailable
}

// oneLine folds s onto one line, without a leading "pglocks: " (the
// caller adds it).
func oneLine(s string) string {
	return strings.TrimPrefix(strings.Join(strings.Fields(s), " "), "pglocks: ")
}

// newFlags returns a flag set for a subcommand that reports errors as
// usage errors, with --dsn when db is true.
func newFlags(name string, stderr io.Writer, db bool) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("pglocks "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var dsn *string
	if db {
		dsn = fs.String("dsn", "", "PostgreSQL connection string (default: DATABASE_URL, else libpq PG* variables)")
	}
	return fs, dsn
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return exitCode(exitUsage) // flag already printed the problem
	}
	return nil
}

// connect opens a pool on --dsn, DATABASE_URL or the PG* variables, and
// checks that the server answers. Errors name the host and port.
func connect(ctx context.Context, dsn string, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	if dsn == "" {
		dsn = os.Getenv("DATABASE_URL")
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fail(exitUsage, "bad connection string: %v", err)
	}
	for _, f := range configure {
		f(cfg)
	}
	where := fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fail(exitUnavailable, "connect to %s: %v", where, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		var pgErr *pgconn.PgError
		var netErr *net.OpError
		switch {
		case errors.As(err, &pgErr):
			return nil, fail(exitUnavailable, "connect to %s: %s (SQLSTATE %s)", where, pgErr.Message, pgErr.Code)
		case errors.As(err, &netErr):
			return nil, fail(exitUnavailable, "connect to %s: %v", where, netErr.Err)
		}
		return nil, fail(exitUnavailable, "connect to %s: %v", where, err)
	}
	return pool, nil
}
