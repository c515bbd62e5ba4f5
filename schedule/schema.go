package schedule

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// SchemaSQL returns the DDL that [Runner.Migrate] runs for the run table
// of cfg (only Schema, Table and History are read), as one idempotent SQL
// script, for those who manage schema changes with goose, golang-migrate,
// atlas or psql. The lease table is the lease package's (lease.SchemaSQL).
// For the zero Config it creates public.pglocks_runs:
//
//	create table if not exists "public"."pglocks_runs" (
//		job        text        not null check (octet_length(job) between 1 and 512),
//		token      bigint      not null,  -- the run's lease token
//		slot       text        not null,  -- the slot's key
//		slot_start timestamptz,           -- a period slot's start, by the server clock
//		owner      uuid        not null,  -- the run's lease owner
//		hostname   text,
//		pid        integer,
//		started_at timestamptz not null,  -- server clock
//		ended_at   timestamptz,           -- server clock; null while running or crashed
//		outcome    text        not null,  -- running, succeeded, failed, finished, lost, crashed
//		error      text,
//		primary key (job, token)
//	);
//
// The table has no unique key on (job, slot): a crashed run's slot may be
// run again (Policy.RerunCrashed), and the job's lease, which only one
// replica holds and which guards the transaction that marks a run, is what
// keeps a slot to one run.
func SchemaSQL(cfg Config) (string, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validateTable(); err != nil {
		return "", err
	}
	return strings.Join(schemaStatements(cfg), ";\n\n") + ";\n", nil
}

func schemaStatements(cfg Config) []string {
	table := pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize()
	var stmts []string
	if cfg.Schema != DefaultSchema {
		stmts = append(stmts, "create schema if not exists "+pgx.Identifier{cfg.Schema}.Sanitize())
	}
	stmts = append(stmts, `create table if not exists `+table+` (
	job        text        not null check (octet_length(job) between 1 and `+strconv.Itoa(MaxJobLen)+`),
	token      bigint      not null,
	slot       text        not null,
	slot_start timestamptz,
	owner      uuid        not null,
	hostname   text,
	pid        integer,
	started_at timestamptz not null,
	ended_at   timestamptz,
	outcome    text        not null check (outcome in ('running', 'succeeded', 'failed', 'finished', 'lost', 'crashed')),
	error      text,
	primary key (job, token)
)`,
		`comment on table `+table+` is 'pglocks scheduled runs (github.com/pglocks/pglocks/schedule): `+
			`the last runs of each job, one per slot.'`,
	)
	return stmts
}

// Migrate creates the lease table (see lease.Store.Migrate) and the run
// table, with its schema if not public, when missing. It is idempotent and
// safe to run from many processes at once: it serializes on a
// transaction-scoped advisory lock. It needs the CREATE privilege;
// running jobs needs SELECT, INSERT, UPDATE and DELETE on the run table.
// ctx bounds the whole migration.
func (r *Runner) Migrate(ctx context.Context) error {
	if err := r.usable(); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if ctx == nil {
		return errors.New("schedule: migrate: nil context")
	}
	if err := r.cfg.Store.Migrate(ctx); err != nil {
		return fmt.Errorf("schedule: migrate: %w", err)
	}
	err := pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) error {
		lockName := "pglocks:schedule:migrate:" + r.cfg.Schema + "." + r.cfg.Table
		if _, err := tx.Exec(ctx, "select pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended($1::text, 0))", r.args(lockName)...); err != nil {
			return err
		}
		for _, stmt := range schemaStatements(r.cfg) {
			if _, err := tx.Exec(ctx, stmt, r.args()...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("schedule: migrate %s.%s: %w", r.cfg.Schema, r.cfg.Table, err)
	}
	return nil
}
