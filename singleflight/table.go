package singleflight

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/ident"
)

// DefaultTable is the table [NewTable] uses when given no name.
const DefaultTable = "pglocks_singleflight"

// Table stores results in a PostgreSQL table (key text primary key, value
// bytea, expires_at by the server clock). Create it with [Table.Migrate]
// or [Table.SchemaSQL]; remove expired rows with [Table.Purge] (Get
// ignores them, Put replaces them).
type Table struct {
	pool      *pgxpool.Pool
	qualified string
}

// NewTable returns a Table in schema.table on pool; empty names mean
// "public" and [DefaultTable]. Both must be plain identifiers.
func NewTable(pool *pgxpool.Pool, schema, table string) (*Table, error) {
	if pool == nil {
		return nil, errors.New("singleflight: NewTable: nil pool")
	}
	if schema == "" {
		schema = "public"
	}
	if table == "" {
		table = DefaultTable
	}
	for _, f := range []struct{ what, v string }{{"schema", schema}, {"table", table}} {
		if err := ident.Check(f.v); err != nil {
			return nil, fmt.Errorf("singleflight: NewTable: %s: %w", f.what, err)
		}
	}
	return &Table{pool: pool, qualified: pgx.Identifier{schema, table}.Sanitize()}, nil
}

// SchemaSQL returns the statement that creates the table (idempotent), for
// migration tools.
func (t *Table) SchemaSQL() string {
	if t == nil {
		return ""
	}
	return "create table if not exists " + t.qualified + ` (
	key        text primary key,
	value      bytea not null,
	expires_at timestamptz not null
)`
}

// Migrate creates the table if it does not exist.
func (t *Table) Migrate(ctx context.Context) error {
	if err := t.usable(); err != nil {
		return fmt.Errorf("singleflight: migrate: %w", err)
	}
	if _, err := t.pool.Exec(ctx, t.SchemaSQL()); err != nil {
		return fmt.Errorf("singleflight: migrate: %w", err)
	}
	return nil
}

// Get returns the unexpired value stored for key.
func (t *Table) Get(ctx context.Context, key string) ([]byte, bool, error) {
	if err := t.usable(); err != nil {
		return nil, false, err
	}
	var v []byte
	err := t.pool.QueryRow(ctx, "select value from "+t.qualified+" where key = $1 and expires_at > clock_timestamp()", key).Scan(&v)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	}
	return v, true, nil
}

// Put stores value for key until ttl has passed by the server clock.
func (t *Table) Put(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	if err := t.usable(); err != nil {
		return err
	}
	if value == nil {
		value = []byte{}
	}
	_, err := t.pool.Exec(ctx, "insert into "+t.qualified+` (key, value, expires_at)
values ($1, $2, clock_timestamp() + $3 * interval '1 microsecond')
on conflict (key) do update set value = excluded.value, expires_at = excluded.expires_at`,
		key, value, ttl.Microseconds())
	return err
}

// Purge deletes expired rows and returns how many.
func (t *Table) Purge(ctx context.Context) (int64, error) {
	if err := t.usable(); err != nil {
		return 0, fmt.Errorf("singleflight: purge: %w", err)
	}
	tag, err := t.pool.Exec(ctx, "delete from "+t.qualified+" where expires_at <= clock_timestamp()")
	if err != nil {
		return 0, fmt.Errorf("singleflight: purge: %w", err)
	}
	return tag.RowsAffected(), nil
}

// usable says why t, nil or the zero Table, is no table (no panic: see
// internal/nilsafe); nil for a Table NewTable made.
func (t *Table) usable() error {
	if t == nil || t.pool == nil {
		return errors.New("singleflight: nil or zero *Table (make one with NewTable)")
	}
	return nil
}
