package main_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

// TestDoctorEngineUndecidedIsNotSafe: an engine whose transaction locks
// raise "not supported" and whose clock is frozen. The error of one check
// does not throw away the others (the clock is still checked and found
// frozen), and --need=leases fails.
func TestDoctorEngineUndecidedIsNotSafe(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	c := cli{t: t, dsn: db.DSN}
	if _, errOut, code := c.run("migrate"); code != 0 {
		t.Fatalf("migrate: %d %s", code, errOut)
	}
	conn := db.Conn(t)
	for _, s := range []string{
		"create schema liar",
		`create function liar.pg_try_advisory_xact_lock(bigint) returns boolean language plpgsql as $$begin raise exception 'advisory xact locks not supported' using errcode = '0A000'; end$$`,
		"create function liar.clock_timestamp() returns timestamptz language sql as 'select pg_catalog.now()'",
		"alter database " + pgx.Identifier{db.Name}.Sanitize() + " set search_path = liar, pg_catalog, public",
	} {
		if _, err := conn.Exec(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	out, code := doctorRun(t, db.DSN, "--need=leases")
	wantLine(t, out, "clock_timestamp() advances", "NO")
	if code != 1 {
		t.Errorf("status %d with --need=leases on a frozen clock, want 1", code)
	}
}
