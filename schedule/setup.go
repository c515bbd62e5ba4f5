package schedule

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pglocks/pglocks/lease"
)

// ErrNoTable is wrapped by the error of a statement that found no run
// table (SQLSTATE 42P01): create it with [Runner.Migrate] or the DDL of
// [SchemaSQL]. The lease table's absence is the lease package's
// lease.ErrNoTable.
var ErrNoTable = errors.New("schedule: no run table")

// noTableError says that the run table is missing and how to create it,
// wrapping ErrNoTable and the server's error.
type noTableError struct {
	table string
	err   error
}

// Error names the table and the cure, then the server's error.
func (e *noTableError) Error() string {
	return fmt.Sprintf("schedule: table %s does not exist: create it with Runner.Migrate (which creates the lease table too), "+
		"with the DDL of schedule.SchemaSQL in your migration tool, or with \"pglocks migrate\": %v", e.table, e.err)
}

// Unwrap returns ErrNoTable and the server's error.
func (e *noTableError) Unwrap() []error { return []error{ErrNoTable, e.err} }

// explain returns err, the error of a statement on the run table, as an
// error wrapping ErrNoTable when the server says the table is missing.
// The lease package explains its own table's absence (lease.ErrNoTable),
// and the run's statements name no other table.
func (r *Runner) explain(err error) error {
	var pe *pgconn.PgError
	if err == nil || !errors.As(err, &pe) || pe.Code != "42P01" || errors.Is(err, lease.ErrNoTable) || errors.Is(err, ErrNoTable) {
		return err
	}
	return &noTableError{table: pgx.Identifier{r.cfg.Schema, r.cfg.Table}.Sanitize(), err: err}
}
