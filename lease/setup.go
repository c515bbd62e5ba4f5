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
// says what cures it. Only the store's own statement failing on the
// store's own table or schema, as the server's message names them, is
// explained: statements that do not name the table (the cleanup's
// pg_terminate_backend, LISTEN), errors raised inside a trigger or
// function (PgError.Where is set), and errors about other objects (a
// trigger's missing table, EXECUTE on pg_notify) are left alone. Guard's
// errors speak of the caller's transaction: its role, and a read-only
// transaction rather than a read-only server.

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
	schema, table string
	quoted        string // "schema"."table", as in every statement on the table
	role          string // the pool's configured user; "" if none is set
	database      string // the pool's configured database
}

func newTableRef(cfg Config, cc *pgx.ConnConfig) *tableRef {
	return &tableRef{schema: cfg.Schema, table: cfg.Table, quoted: pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize(),
		role: cc.User, database: cc.Database}
}

// grantee is role, quoted for a GRANT statement in an error message.
func grantee(role string) string {
	if role == "" {
		return "<role>"
	}
	return pgx.Identifier{role}.Sanitize()
}

// setupCause returns the server's error in err when the store's statement
// sql itself (not a trigger or function it ran: PgError.Where is empty)
// failed for want of setup on the store's own table or schema, as the
// message names them; else nil. Errors about other objects — a trigger's
// missing table, EXECUTE on pg_notify — are the caller's to read as they
// are.
func (t *tableRef) setupCause(sql string, err error) *pgconn.PgError {
	var pe *pgconn.PgError
	if err == nil || !errors.As(err, &pe) || pe.Where != "" || errors.As(err, new(*setupError)) ||
		sql != "" && !strings.Contains(sql, t.quoted) {
		return nil
	}
	switch pe.Code {
	case "42P01": // undefined_table
		if pe.Message == `relation "`+t.schema+"."+t.table+`" does not exist` {
			return pe
		}
	case "42501": // insufficient_privilege: on the table, or USAGE on its schema
		if pe.Message == "permission denied for table "+t.table || t.noUsage(pe) {
			return pe
		}
	case "25006": // read_only_sql_transaction
		return pe
	}
	return nil
}

// noUsage reports whether pe says the role lacks USAGE (or CREATE) on the
// table's schema.
func (t *tableRef) noUsage(pe *pgconn.PgError) bool {
	return pe.Message == "permission denied for schema "+t.schema
}

// noTable is the error of a statement that found no table.
func (t *tableRef) noTable(err error) error {
	return &setupError{kind: ErrNoTable, err: err, msg: fmt.Sprintf(
		`lease: table %s does not exist: create it with Store.Migrate, with the DDL of lease.SchemaSQL in your migration tool, or with "pglocks migrate"`,
		t.quoted)}
}

// grant is the GRANT that gives role the privileges on the table (and its
// schema when pe says it lacks USAGE).
func (t *tableRef) grant(pe *pgconn.PgError, privileges, role string) string {
	g := fmt.Sprintf("grant %s on %s to %s", privileges, t.quoted, grantee(role))
	if t.noUsage(pe) {
		g = fmt.Sprintf("grant usage on schema %s to %s; %s", pgx.Identifier{t.schema}.Sanitize(), grantee(role), g)
	}
	return g
}

// explain returns err, the result of statement sql on the store's pool,
// as a setupError when sql names the table and the server refused it for
// want of setup (see setupCause).
func (t *tableRef) explain(sql string, err error) error {
	pe := t.setupCause(sql, err)
	if pe == nil {
		return err
	}
	switch pe.Code {
	case "42P01":
		return t.noTable(err)
	case "42501":
		return &setupError{kind: ErrNoPrivilege, err: err, msg: fmt.Sprintf(
			"lease: role %s may not use table %s (it needs USAGE on the schema and SELECT, INSERT and UPDATE on the table): as the table's owner, run: %s",
			grantee(t.role), t.quoted, t.grant(pe, "select, insert, update", t.role))}
	}
	return &setupError{kind: ErrReadOnly, err: err, msg: "lease: the server is read-only (a standby, or default_transaction_read_only is on) and leases are written: " +
		"point the pool at the primary (with several hosts in its DSN, add target_session_attrs=read-write)"}
}

// explainGuard is explain for Guard's statement, run in the caller's
// transaction tx: the role is the transaction's (current_user, which is
// the role its connection logs in as unless SET ROLE changed it), and a
// read-only server is a read-only transaction, perhaps on the primary.
func (t *tableRef) explainGuard(tx pgx.Tx, sql string, err error) error {
	pe := t.setupCause(sql, err)
	if pe == nil {
		return err
	}
	switch pe.Code {
	case "42P01":
		return t.noTable(err)
	case "42501":
		var role string
		if c := tx.Conn(); c != nil {
			role = c.Config().User
		}
		return &setupError{kind: ErrNoPrivilege, err: err, msg: fmt.Sprintf(
			"lease: the transaction's role (current_user; its connection logs in as %s) may not use table %s "+
				"(Guard locks the lease row FOR SHARE: it needs USAGE on the schema and SELECT and UPDATE on the table): "+
				"as the table's owner, run: %s (to the role SET ROLE made current, if the transaction changed it)",
			grantee(role), t.quoted, t.grant(pe, "select, update", role))}
	}
	return &setupError{kind: ErrReadOnly, err: err, msg: "lease: Guard locks the lease row FOR SHARE, which a read-only transaction may not: " +
		"begin the transaction read-write (not BEGIN READ ONLY or pgx.ReadOnly, with default_transaction_read_only off), on the primary"}
}

// explainMigrate returns err, the error of Migrate, as a setupError when
// the server is read-only or the role may not create the table, its
// schema, or the column Migrate adds to a table made by an earlier
// version.
func (t *tableRef) explainMigrate(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Where != "" {
		return err
	}
	var cure string
	switch {
	case pe.Code == "25006":
		return &setupError{kind: ErrReadOnly, err: err, msg: "lease: the server is read-only (a standby, or default_transaction_read_only is on) and Migrate creates the table: " +
			"run it against the primary (with several hosts in its DSN, add target_session_attrs=read-write), with default_transaction_read_only off"}
	case pe.Code != "42501":
		return err
	case pe.Message == "must be owner of table "+t.table: // the column of an older table
		cure = "run Migrate as the table's owner"
	case strings.HasPrefix(pe.Message, "permission denied for database "): // the schema does not exist yet
		cure = fmt.Sprintf("run Migrate as a role that may create schema %s, or first: grant create on database %s to %s",
			pgx.Identifier{t.schema}.Sanitize(), t.databaseName(), grantee(t.role))
	case t.noUsage(pe):
		cure = fmt.Sprintf("run Migrate as a role that may (the schema's owner), or first: grant create on schema %s to %s",
			pgx.Identifier{t.schema}.Sanitize(), grantee(t.role))
	default:
		return err
	}
	return &setupError{kind: ErrNoPrivilege, err: err, msg: fmt.Sprintf("lease: role %s may not create table %s: %s", grantee(t.role), t.quoted, cure)}
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
