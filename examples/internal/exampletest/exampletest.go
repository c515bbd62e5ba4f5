// Package exampletest checks that an example leaves a user's database as it
// found it: run with -dsn, it works in a schema of its own and drops it;
// run without, it does not touch DATABASE_URL's database at all.
package exampletest

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglocks/pglocks/examples/internal/exampledb"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// Run is an example's run function.
type Run[T any] func(ctx context.Context, db exampledb.Target, out io.Writer) (T, error)

// userDB returns a database standing for a user's dev database: a table of
// theirs with rows, and pglocks' default lease table in public holding a
// lease of theirs, as an application of theirs would have left it.
func userDB(t *testing.T, ctx context.Context) (string, *pgxpool.Pool) {
	t.Helper()
	db := pgtest.New(t)
	pool := db.NewPool(t)
	if _, err := pool.Exec(ctx, `
		create table public.notes (id int primary key, note text);
		insert into public.notes values (1, 'mine'), (2, 'mine too')`); err != nil {
		t.Fatal(err)
	}
	store, err := lease.New(pool, lease.Config{Hostname: "users-app"})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close(context.WithoutCancel(ctx))
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := store.TryAcquire(ctx, "users-app:job", time.Hour); err != nil {
		t.Fatal(err)
	}
	return db.DSN, pool
}

// catalog lists the database's schemas, relations and functions outside
// the system's, and the rows of the user's tables, one a line.
func catalog(t *testing.T, ctx context.Context, pool *pgxpool.Pool) string {
	t.Helper()
	rows, err := pool.Query(ctx, `
		select 'schema ' || nspname from pg_namespace
		where nspname not like 'pg\_%' and nspname <> 'information_schema'
		union all
		select format('relation %s.%s (%s)', n.nspname, c.relname, c.relkind)
		from pg_class c join pg_namespace n on n.oid = c.relnamespace
		where n.nspname not like 'pg\_%' and n.nspname <> 'information_schema'
		union all
		select format('function %s.%s', n.nspname, p.proname)
		from pg_proc p join pg_namespace n on n.oid = p.pronamespace
		where n.nspname not like 'pg\_%' and n.nspname <> 'information_schema'
		union all
		select 'notes ' || to_jsonb(x)::text from public.notes x
		union all
		select 'lease ' || to_jsonb(l)::text from public.pglocks_leases l
		order by 1`)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// LeavesNothing runs the example with -dsn naming a user's database and
// fails t unless that database's catalog and the user's rows are what they
// were before.
func LeavesNothing[T any](t *testing.T, run Run[T]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	dsn, pool := userDB(t, ctx)
	before := catalog(t, ctx, pool)
	var out bytes.Buffer
	err := exampledb.Run(ctx, []string{"-dsn", dsn}, &out, run)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "in schema "+exampledb.SchemaPrefix) {
		t.Errorf("the first line does not name the example's schema")
	}
	if after := catalog(t, ctx, pool); after != before {
		t.Errorf("the user's database changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// IgnoresDatabaseURL sets DATABASE_URL to a user's database, runs the
// example without flags and fails t unless it ran on a throwaway server and
// left that database as it was. It sets the environment: t must not be
// parallel.
func IgnoresDatabaseURL[T any](t *testing.T, run Run[T]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	dsn, pool := userDB(t, ctx)
	t.Setenv("DATABASE_URL", dsn)
	before := catalog(t, ctx, pool)
	var out bytes.Buffer
	err := exampledb.Run(ctx, nil, &out, run)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "# PostgreSQL: throwaway") {
		t.Errorf("the example did not say it ran on a throwaway server")
	}
	if after := catalog(t, ctx, pool); after != before {
		t.Errorf("DATABASE_URL's database changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}
