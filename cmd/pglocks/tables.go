package main

import (
	"context"
	"flag"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/ident"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/schedule"
)

// tables names the lease table and the scheduled jobs' run table
// (--schema, --table, --run-table), for the commands that use them.
type tables struct {
	schema, table, runTable string
}

func (t *tables) add(fs *flag.FlagSet) {
	fs.StringVar(&t.schema, "schema", lease.DefaultSchema, "schema of the lease table and the run table")
	fs.StringVar(&t.table, "table", lease.DefaultTable, "lease table")
	fs.StringVar(&t.runTable, "run-table", schedule.DefaultTable, "run table of scheduled jobs (run --once-per)")
}

// check validates the names as plain SQL identifiers.
func (t *tables) check() error {
	for _, id := range []string{t.schema, t.table, t.runTable} {
		if err := ident.Check(id); err != nil {
			return fail(exitUsage, "--schema/--table/--run-table: %v", err)
		}
	}
	return nil
}

// leaseConfig is a lease store's Config on the lease table, renewing a
// lease of ttl every ttl/3, at most every maxRenewInterval (so that a
// lease broken with pglocks break stops the job within seconds).
func (t *tables) leaseConfig(ctx context.Context, ttl time.Duration) lease.Config {
	return lease.Config{Logger: loggerOf(ctx), Schema: t.schema, Table: t.table,
		RenewFraction: min(1.0/3, float64(maxRenewInterval)/float64(ttl))}
}

// runner returns a lease store and a schedule runner on the tables.
func (t *tables) runner(ctx context.Context, pool *pgxpool.Pool, ttl time.Duration) (*lease.Store, *schedule.Runner, error) {
	store, err := lease.New(pool, t.leaseConfig(ctx, ttl))
	if err != nil {
		return nil, nil, err
	}
	r, err := schedule.New(schedule.Config{Store: store, Pool: pool, Schema: t.schema, Table: t.runTable})
	if err != nil {
		_ = store.Close(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	return store, r, nil
}
