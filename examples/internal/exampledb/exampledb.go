// Package exampledb gives every example under examples/ its database and its
// main. The rule: an example runs on a throwaway PostgreSQL, started through
// pgtest and removed when the example exits, unless it is given a database
// with the flag -dsn URL (or --dsn). DATABASE_URL is not read: an example
// never writes to an application's database it was not handed on its
// command line. (The throwaway server is pgtest's, so PGTEST_DSN, a test
// server, is honoured as in the tests: a fresh database there, dropped at
// exit. libpq's PG* variables only fill in what a -dsn leaves out.)
//
// Given -dsn, the example works in a schema of its own,
// pglocks_example_<random>, created at the start and dropped (cascade) at
// the end — after a failure or Ctrl-C too — so that nothing is left in that
// database: its tables, lease rows and run history all go in that schema
// (the DSN it gets sets search_path to it, and [Target.Schema] names it for
// the packages' Config.Schema). Only a process killed outright (SIGKILL)
// leaves the schema; its name is on the example's first line.
package exampledb

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/pglocks/pglocks/pgtest"
)

// Timeout bounds a whole example run, server start included.
const Timeout = 2 * time.Minute

// Target is where an example works.
type Target struct {
	// DSN connects to the database. Given -dsn, it is that DSN with
	// search_path set to Schema, so unqualified tables land there.
	DSN string
	// Schema is the schema of every table the example makes, for the
	// Schema of lease.Config, schedule.Config and singleflight.NewTable.
	// Empty means the packages' default, public (of a throwaway database).
	Schema string
}

// DB is the database an example runs on.
type DB struct {
	Target
	// Source says where it came from, for the example's first line.
	Source string

	srv  *pgtest.Server // the throwaway server, if any
	user string         // the DSN given with -dsn, if any
}

// Open returns a throwaway server's fresh database (see [pgtest.Start];
// should the process die before Close, pgtest's watchdog removes the
// server) when dsn is empty. Otherwise it creates a schema of the example's
// own in dsn's database, which Close drops. ctx bounds only the start.
func Open(ctx context.Context, dsn string) (*DB, error) {
	if dsn != "" {
		return openSchema(ctx, dsn)
	}
	srv, err := pgtest.Start(ctx)
	if err != nil {
		return nil, fmt.Errorf("no throwaway server could start (give a database of yours with -dsn URL): %w", err)
	}
	db, err := srv.CreateDatabase(ctx)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("create database: %w", err), srv.Close())
	}
	return &DB{
		Target: Target{DSN: db.DSN},
		Source: fmt.Sprintf("throwaway %s server (-dsn URL to use a database of yours)", srv.Mode()),
		srv:    srv,
	}, nil
}

// Close drops the example's schema from the given database, or removes the
// throwaway server. ctx bounds the drop.
func (db *DB) Close(ctx context.Context) error {
	if db.user != "" {
		return dropSchema(ctx, db.user, db.Schema)
	}
	if db.srv == nil {
		return nil
	}
	return db.srv.Close()
}

// Main is the whole of an example's main: it parses the flags (-dsn), opens
// the database, runs run on it with a context that ends on SIGINT, SIGTERM
// or after [Timeout], writing to stdout, closes the database (see
// [DB.Close]), and on failure exits with status 1 and one line on stderr.
func Main[T any](run func(ctx context.Context, db Target, out io.Writer) (T, error)) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := Run(ctx, os.Args[1:], os.Stdout, run)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// Run is [Main] without the process: it parses args, opens the database,
// runs run on it within [Timeout] of ctx, and closes the database, even
// when run fails or ctx ends.
func Run[T any](ctx context.Context, args []string, out io.Writer, run func(ctx context.Context, db Target, out io.Writer) (T, error)) (err error) {
	fs := flag.NewFlagSet("example", flag.ContinueOnError)
	dsn := fs.String("dsn", "", "run in a schema of its own, dropped at the end, in this database (default: a throwaway server)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: the only flag is -dsn URL", fs.Args())
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()

	db, err := Open(ctx, *dsn)
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		err = errors.Join(err, db.Close(closeCtx))
	}()
	fmt.Fprintf(out, "# PostgreSQL: %s\n", db.Source)
	_, err = run(ctx, db.Target, out)
	return err
}
