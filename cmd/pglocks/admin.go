package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/lease"
)

// cmdKey prints the advisory-lock key of a name, for scripts:
//
//	psql -c "select pg_catalog.pg_try_advisory_lock($(pglocks key nightly))"
func cmdKey(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, _ := newFlags(ctx, "key", helps["key"], stdout, stderr, false)
	sql := fs.Bool("sql", false, "print the SQL expression that computes the key instead")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fail(exitUsage, "usage: pglocks key [--sql] NAME")
	}
	k := pglocks.KeyOf(fs.Arg(0))
	if err := k.Validate(); err != nil {
		return fail(exitUsage, "%v", err)
	}
	if *sql {
		fmt.Fprintln(stdout, k.SQL())
	} else {
		fmt.Fprintln(stdout, k.Int64())
	}
	return nil
}

// cmdMigrate creates the lease table and the run table (idempotent).
func cmdMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, dsn := newFlags(ctx, "migrate", helps["migrate"], stdout, stderr, true)
	var t tables
	t.add(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fail(exitUsage, "usage: pglocks migrate [--schema S] [--table T] [--run-table T]")
	}
	if err := t.check(); err != nil {
		return err
	}
	pool, err := connect(ctx, *dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, runner, err := t.runner(ctx, pool, 30*time.Second)
	if err != nil {
		return err
	}
	defer store.Close(context.WithoutCancel(ctx))
	if err := runner.Migrate(ctx); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "lease table %s.%s and run table %s.%s are ready\n", t.schema, t.table, t.schema, t.runTable)
	return nil
}

// cmdBreak breaks a lease: its token is bumped, so its holder loses it and
// the holder's guarded writes fail.
func cmdBreak(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, dsn := newFlags(ctx, "break", helps["break"], stdout, stderr, true)
	var t tables
	t.add(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fail(exitUsage, "usage: pglocks break NAME")
	}
	if err := t.check(); err != nil {
		return err
	}
	return withStore(ctx, *dsn, t, func(store *lease.Store) error {
		token, err := store.Break(ctx, fs.Arg(0))
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "broke lease %s; its token is now %d\n", fs.Arg(0), token)
		return nil
	})
}

// withStore runs fn with a lease store on the database.
func withStore(ctx context.Context, dsn string, t tables, fn func(*lease.Store) error) error {
	pool, err := connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := lease.New(pool, t.leaseConfig(ctx, 30*time.Second))
	if err != nil {
		return err
	}
	defer store.Close(context.WithoutCancel(ctx))
	return fn(store)
}
