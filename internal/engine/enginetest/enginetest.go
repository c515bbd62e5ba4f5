// Package enginetest makes a real PostgreSQL database lie the way some
// PostgreSQL-compatible engines do, for tests of the engine probe and of
// its callers.
//
// [Lie] and [LieForms] replace the server's own functions: in the
// database's pg_catalog (allow_system_table_mods, a superuser's session
// setting; pg_catalog is per database, so other databases are untouched)
// each chosen function is renamed away and a SQL function of the same
// name and arguments takes its place, answering as if it had locked (or
// read the clock) and doing nothing. pglocks' pg_catalog-qualified calls
// reach these, exactly as they would reach CockroachDB's no-op stubs.
//
// [Shadow] puts the same liars in a schema before pg_catalog in the
// database's search_path instead: the way a database could shadow the
// functions for unqualified calls. pglocks qualifies its calls, so it must
// be immune to that (tests pin it).
package enginetest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/internal/engine"
	"github.com/pglocks/pglocks/pgtest"
)

// Form is one set of functions a test can make lie.
type Form string

// The forms.
const (
	ExclusiveInt64 Form = "exclusive int8"      // pg_try_advisory_lock(bigint), pg_advisory_lock(bigint), pg_advisory_unlock(bigint)
	SharedInt64    Form = "shared int8"         // the _shared functions of a bigint key
	ExclusivePair  Form = "exclusive int4 pair" // pg_try_advisory_lock(int, int), pg_advisory_unlock(int, int)
	SharedPair     Form = "shared int4 pair"    // the _shared functions of a pair key
	Xact           Form = "transaction"         // pg_try_advisory_xact_lock and kin, every key form
	Clock          Form = "clock"               // clock_timestamp()
)

// fn is one function to replace: name, arguments, the liar's result type
// and body.
type fn struct{ name, args, returns, body string }

var forms = map[Form][]fn{
	ExclusiveInt64: {
		{"pg_try_advisory_lock", "bigint", "boolean", "select true"},
		{"pg_advisory_lock", "bigint", "void", ""},
		{"pg_advisory_unlock", "bigint", "boolean", "select true"},
	},
	SharedInt64: {
		{"pg_try_advisory_lock_shared", "bigint", "boolean", "select true"},
		{"pg_advisory_lock_shared", "bigint", "void", ""},
		{"pg_advisory_unlock_shared", "bigint", "boolean", "select true"},
	},
	ExclusivePair: {
		{"pg_try_advisory_lock", "integer, integer", "boolean", "select true"},
		{"pg_advisory_unlock", "integer, integer", "boolean", "select true"},
	},
	SharedPair: {
		{"pg_try_advisory_lock_shared", "integer, integer", "boolean", "select true"},
		{"pg_advisory_unlock_shared", "integer, integer", "boolean", "select true"},
	},
	Xact: {
		{"pg_try_advisory_xact_lock", "bigint", "boolean", "select true"},
		{"pg_try_advisory_xact_lock", "integer, integer", "boolean", "select true"},
		{"pg_try_advisory_xact_lock_shared", "bigint", "boolean", "select true"},
		{"pg_try_advisory_xact_lock_shared", "integer, integer", "boolean", "select true"},
		{"pg_advisory_xact_lock", "bigint", "void", ""},
	},
	Clock: {
		{"clock_timestamp", "", "timestamp with time zone", "select pg_catalog.now()"},
	},
}

// primitives maps each primitive to its forms.
var primitives = map[engine.Primitive][]Form{
	engine.SessionLocks: {ExclusiveInt64, SharedInt64, ExclusivePair, SharedPair},
	engine.XactLocks:    {Xact},
	engine.Clock:        {Clock},
}

// Lie makes the server's own functions of each primitive in ps lie in db
// (see [LieForms]).
func Lie(t testing.TB, db *pgtest.DB, ps ...engine.Primitive) {
	t.Helper()
	var fs []Form
	for _, p := range ps {
		fs = append(fs, primitives[p]...)
	}
	LieForms(t, db, fs...)
}

// LieForms replaces the server's own functions of each form in db's
// pg_catalog with liars (see the package doc). Connections opened before
// keep the real functions in the plans they cached.
func LieForms(t testing.TB, db *pgtest.DB, fs ...Form) {
	t.Helper()
	stmts := []string{"set allow_system_table_mods = on"}
	for _, f := range fs {
		for _, x := range forms[f] {
			stmts = append(stmts,
				fmt.Sprintf("alter function pg_catalog.%s(%s) rename to %s_real", x.name, x.args, x.name),
				fmt.Sprintf("create function pg_catalog.%s(%s) returns %s language sql as %s", x.name, x.args, x.returns, quote(x.body)))
		}
	}
	stmts = append(stmts, "reset allow_system_table_mods")
	run(t, db, stmts)
}

// Shadow creates liars of each form in schema liar and puts it before
// pg_catalog in db's search_path, for the connections opened after.
func Shadow(t testing.TB, db *pgtest.DB, fs ...Form) {
	t.Helper()
	stmts := []string{"create schema if not exists liar"}
	for _, f := range fs {
		for _, x := range forms[f] {
			stmts = append(stmts, fmt.Sprintf("create function liar.%s(%s) returns %s language sql as %s", x.name, x.args, x.returns, quote(x.body)))
		}
	}
	stmts = append(stmts, "alter database "+pgx.Identifier{db.Name}.Sanitize()+" set search_path = liar, pg_catalog, public")
	run(t, db, stmts)
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func run(t testing.TB, db *pgtest.DB, stmts []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := db.Conn(t)
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("enginetest: %s: %v", s, err)
		}
	}
}
