// Package exampledb gives every example under examples/ its database and its
// main: DATABASE_URL when it is set, else a throwaway PostgreSQL started
// through pgtest and removed when the example exits.
package exampledb

import (
	"context"
	"errors"
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

// DB is the database an example runs on.
type DB struct {
	// DSN connects to it.
	DSN string
	// Source says where it came from, for the example's first line.
	Source string

	srv *pgtest.Server
}

// Open returns DATABASE_URL's database when that is set; the examples create
// what they need there (tables, lease rows) and leave it. Otherwise it starts a
// throwaway server (see [pgtest.Start]) with a fresh database, which Close
// removes; should the process die first, pgtest's watchdog removes it instead.
// ctx bounds only the start.
func Open(ctx context.Context) (*DB, error) {
	if dsn := os.Getenv("DATABASE_URL"); dsn != "" {
		return &DB{DSN: dsn, Source: "DATABASE_URL"}, nil
	}
	srv, err := pgtest.Start(ctx)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL is not set, and no throwaway server could start: %w", err)
	}
	db, err := srv.CreateDatabase(ctx)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("create database: %w", err), srv.Close())
	}
	return &DB{
		DSN:    db.DSN,
		Source: fmt.Sprintf("throwaway %s server (set DATABASE_URL to use yours)", srv.Mode()),
		srv:    srv,
	}, nil
}

// Close removes the throwaway server, if Open started one.
func (db *DB) Close() error {
	if db.srv == nil {
		return nil
	}
	return db.srv.Close()
}

// Main is the whole of an example's main: it opens the database, runs run on
// it with a context that ends on SIGINT, SIGTERM or after [Timeout], writing to
// stdout, removes the database's throwaway server, and on failure exits with
// status 1 and one line on stderr.
func Main[T any](run func(ctx context.Context, dsn string, out io.Writer) (T, error)) {
	if err := runMain(run); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func runMain[T any](run func(ctx context.Context, dsn string, out io.Writer) (T, error)) (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()

	db, err := Open(ctx)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, db.Close()) }()
	fmt.Printf("# PostgreSQL: %s\n", db.Source)
	_, err = run(ctx, db.DSN, os.Stdout)
	return err
}
