// Package enginetest makes a real PostgreSQL database lie the way some
// PostgreSQL-compatible engines do, for tests of the engine probe and of
// its callers: a schema put before pg_catalog in the database's
// search_path shadows the advisory-lock functions (and clock_timestamp())
// with SQL functions that answer as if they had locked (or read the
// clock) and do nothing. pglocks' statements call these functions
// unqualified, so they call the shadows, exactly as they would call
// CockroachDB's no-op stubs.
package enginetest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/internal/engine"
	"github.com/pglocks/pglocks/pgtest"
)

// shadows holds, per primitive, the functions that replace PostgreSQL's.
var shadows = map[engine.Primitive][]string{
	engine.SessionLocks: {
		"create function liar.pg_try_advisory_lock(bigint) returns boolean language sql as 'select true'",
		"create function liar.pg_try_advisory_lock(int, int) returns boolean language sql as 'select true'",
		"create function liar.pg_try_advisory_lock_shared(bigint) returns boolean language sql as 'select true'",
		"create function liar.pg_try_advisory_lock_shared(int, int) returns boolean language sql as 'select true'",
		"create function liar.pg_advisory_lock(bigint) returns void language sql as ''",
		"create function liar.pg_advisory_unlock(bigint) returns boolean language sql as 'select true'",
		"create function liar.pg_advisory_unlock(int, int) returns boolean language sql as 'select true'",
		"create function liar.pg_advisory_unlock_shared(bigint) returns boolean language sql as 'select true'",
		"create function liar.pg_advisory_unlock_shared(int, int) returns boolean language sql as 'select true'",
	},
	engine.XactLocks: {
		"create function liar.pg_try_advisory_xact_lock(bigint) returns boolean language sql as 'select true'",
		"create function liar.pg_try_advisory_xact_lock(int, int) returns boolean language sql as 'select true'",
		"create function liar.pg_advisory_xact_lock(bigint) returns void language sql as ''",
	},
	engine.Clock: {
		"create function liar.clock_timestamp() returns timestamptz language sql as 'select pg_catalog.now()'",
	},
}

// Lie makes db's future connections call functions that lie about each
// primitive in ps: it creates schema liar with the shadows and sets the
// database's search_path to liar, pg_catalog, public. Connections opened
// before keep PostgreSQL's functions.
func Lie(t testing.TB, db *pgtest.DB, ps ...engine.Primitive) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := db.Conn(t)
	stmts := []string{"create schema liar"}
	for _, p := range ps {
		stmts = append(stmts, shadows[p]...)
	}
	stmts = append(stmts, "alter database "+pgx.Identifier{db.Name}.Sanitize()+" set search_path = liar, pg_catalog, public")
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("enginetest: %s: %v", s, err)
		}
	}
}
