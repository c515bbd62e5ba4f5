package lease

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Errors of a store that is not set up — no lease table, a role without
// the privileges it needs, a read-only server — are recognised in one
// place: every statement the store sends on its table passes through
// modalPool or modalConn (pooler.go), whose results go through
// [tableRef.explain], and so does Guard's in the caller's transaction. The
// error then wraps [ErrNoTable], [ErrNoPrivilege] or [ErrReadOnly] and the
// server's error, whose SQLSTATE keeps it fatal for internal/outcome, and
// says what cures it. Statements that do not name the table (the
// cleanup's pg_terminate_backend, LISTEN) are left alone.

// setupError is an error that says what is not set up and how to set it
// up, wrapping kind (a sentinel) and err (the server's error).
type setupError struct {
	kind error
	msg  string
	err  error
}

// Error is msg followed by the server's error.
func (e *setupError) Error() string { return e.msg + ": " + e.err.Error() }

// Unwrap returns the sentinel and the server's error.
func (e *setupError) Unwrap() []error { return []error{e.kind, e.err} }

// tableRef is the store's table as its statements name it, and the role
// its pool connects as, for the errors that name them.
type tableRef struct {
	schema   string
	quoted   string // "schema"."table", as in every statement on the table
	role     string // the pool's configured user; "" if none is set
	database string // the pool's configured database
}

func newTableRef(cfg Config, cc *pgx.ConnConfig) *tableRef {
	return &tableRef{schema: cfg.Schema, quoted: pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize(), role: cc.User, database: cc.Database}
}

// grantee is the role for a GRANT statement in an error message.
func (t *tableRef) grantee() string {
	if t.role == "" {
		return "<role>"
	}
	return pgx.Identifier{t.role}.Sanitize()
}

// explain returns err, the result of statement sql, as a setupError when
// sql names the table and the server refused it for want of setup.
func (t *tableRef) explain(sql string, err error) error {
	var pe *pgconn.PgError
	if err == nil || !errors.As(err, &pe) || !strings.Contains(sql, t.quoted) || errors.As(err, new(*setupError)) {
		return err
	}
	switch pe.Code {
	case "42P01": // undefined_table
		return &setupError{kind: ErrNoTable, err: err, msg: fmt.Sprintf(
			`lease: table %s does not exist: create it with Store.Migrate, with the DDL of lease.SchemaSQL in your migration tool, or with "pglocks migrate"`,
			t.quoted)}
	case "42501": // insufficient_privilege: on the table, or USAGE on its schema
		grant := fmt.Sprintf("grant select, insert, update on %s to %s", t.quoted, t.grantee())
		if strings.Contains(pe.Message, "schema") {
			grant = fmt.Sprintf("grant usage on schema %s to %s; %s", pgx.Identifier{t.schema}.Sanitize(), t.grantee(), grant)
		}
		return &setupError{kind: ErrNoPrivilege, err: err, msg: fmt.Sprintf(
			"lease: role %s may not use table %s (it needs USAGE on the schema and SELECT, INSERT and UPDATE on the table): as the table's owner, run: %s",
			t.grantee(), t.quoted, grant)}
	case "25006": // read_only_sql_transaction
		return &setupError{kind: ErrReadOnly, err: err, msg: "lease: the server is read-only (a standby, or default_transaction_read_only is on) and leases are written: " +
			"point the pool at the primary (with several hosts in its DSN, add target_session_attrs=read-write)"}
	}
	return err
}

// explainMigrate returns err, the error of Migrate, as a setupError when
// the role may not create the table, its schema, or the column Migrate
// adds to a table made by an earlier version.
func (t *tableRef) explainMigrate(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42501" {
		return err
	}
	var cure string
	switch {
	case strings.Contains(pe.Message, "owner"): // must be owner of table: the column of an older table
		cure = "run Migrate as the table's owner"
	case strings.Contains(pe.Message, "database"): // the schema does not exist yet
		cure = fmt.Sprintf("run Migrate as a role that may create schema %s, or first: grant create on database %s to %s",
			pgx.Identifier{t.schema}.Sanitize(), t.databaseName(), t.grantee())
	default:
		cure = fmt.Sprintf("run Migrate as a role that may (the schema's owner), or first: grant create on schema %s to %s",
			pgx.Identifier{t.schema}.Sanitize(), t.grantee())
	}
	return &setupError{kind: ErrNoPrivilege, err: err, msg: fmt.Sprintf("lease: role %s may not create table %s: %s", t.grantee(), t.quoted, cure)}
}

// databaseName is the pool's database for an error message.
func (t *tableRef) databaseName() string {
	if t.database == "" {
		return "<database>"
	}
	return pgx.Identifier{t.database}.Sanitize()
}

// explainedRows is pgx.Rows whose error goes through explain.
type explainedRows struct {
	pgx.Rows
	t   *tableRef
	sql string
}

// Err is the rows' error, explained.
func (r explainedRows) Err() error { return r.t.explain(r.sql, r.Rows.Err()) }

// explainedRow is pgx.Row whose error goes through explain.
type explainedRow struct {
	row pgx.Row
	t   *tableRef
	sql string
}

// Scan is the row's Scan, its error explained.
func (r explainedRow) Scan(dest ...any) error { return r.t.explain(r.sql, r.row.Scan(dest...)) }
