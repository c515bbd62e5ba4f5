package lease

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// SchemaSQL returns the DDL that [Store.Migrate] runs for cfg, as one SQL
// script, for those who manage schema changes with goose, golang-migrate,
// atlas or psql. It is idempotent (IF NOT EXISTS throughout). For the zero
// Config it creates public.pglocks_leases:
//
//	create table if not exists "public"."pglocks_leases" (
//		name        text        primary key check (octet_length(name) between 1 and 1024),
//		owner       uuid,        -- null once released or broken
//		attempt     uuid,        -- the acquire attempt that took it
//		token       bigint      not null check (token > 0),
//		ttl         interval    not null,
//		acquired_at timestamptz not null,
//		renewed_at  timestamptz not null,
//		expires_at  timestamptz not null,
//		hostname    text,
//		pid         integer,
//		metadata    jsonb
//	) with (fillfactor = 70);
//
// Rows are never deleted (but by [Store.Forget] and [Store.ForgetIdle],
// for names whose tokens fence nothing): the token of a name survives its
// release, so the next acquisition's token is higher. Those two need
// DELETE on the table; nothing else does. The attempt column identifies the
// acquire attempt that took the row, so that an attempt whose outcome is
// unknown can be cleaned up without touching any other acquisition; a table
// made by an earlier version gets it from Migrate (alter table … add column,
// which needs the table's owner). The table has no index besides its
// primary key, so that acquire, renew and release are HOT updates.
func SchemaSQL(cfg Config) (string, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
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
	stmts = append(stmts,
		`create table if not exists `+table+` (
	name        text        primary key check (octet_length(name) between 1 and `+strconv.Itoa(MaxNameLen)+`),
	owner       uuid,
	attempt     uuid,
	token       bigint      not null check (token > 0),
	ttl         interval    not null,
	acquired_at timestamptz not null,
	renewed_at  timestamptz not null,
	expires_at  timestamptz not null,
	hostname    text,
	pid         integer,
	metadata    jsonb
) with (fillfactor = 70)`,
		// A table made before the attempt column: add it, without taking
		// the table's lock when it is there already.
		`do $$ begin
	if not exists (select from pg_attribute where attrelid = '`+strings.ReplaceAll(table, "'", "''")+`'::regclass
		and attname = 'attempt' and not attisdropped) then
		alter table `+table+` add column attempt uuid;
	end if;
end $$`,
		`comment on table `+table+` is 'pglocks leases (github.com/pglocks/pglocks/lease). `+
			`Rows are never deleted, so that fencing tokens only grow.'`,
	)
	return stmts
}

// Migrate creates the lease table (and its schema, if not public) when
// missing. It is idempotent and safe to run from many processes at once:
// it serializes on a transaction-scoped advisory lock. It needs the CREATE
// privilege on the schema (and on the database, for a schema not yet made);
// everything else in this package needs only USAGE on the schema and
// SELECT, INSERT and UPDATE on the table. A role without it gets an error
// wrapping [ErrNoPrivilege] that names the GRANT to run; a read-only
// server (a standby, default_transaction_read_only) one wrapping
// [ErrReadOnly]. ctx bounds the whole migration.
func (s *Store) Migrate(ctx context.Context) error {
	if err := checkCtx(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if err := s.checkOpen(); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		lockName := "pglocks:lease:migrate:" + s.cfg.Schema + "." + s.cfg.Table
		if _, err := tx.Exec(ctx, "select pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended($1::text, 0))", txArgs(tx, []any{lockName})...); err != nil {
			return err
		}
		for _, stmt := range schemaStatements(s.cfg) {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("lease: migrate %s.%s: %w", s.cfg.Schema, s.cfg.Table, s.pool.t.explainMigrate(err))
	}
	return nil
}
