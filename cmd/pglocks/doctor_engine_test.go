package main_test

import (
	"testing"

	"github.com/pglocks/pglocks/internal/engine"
	"github.com/pglocks/pglocks/internal/engine/enginetest"
	"github.com/pglocks/pglocks/pgtest"
)

// TestDoctorEngineVerdict: doctor says PostgreSQL behaves, and says of a
// database whose search_path shadows the session-lock functions and
// clock_timestamp() with ones that lie (as CockroachDB's lock stubs do)
// that it is not compatible, naming what failed, and fails --need for the
// features that depend on it.
func TestDoctorEngineVerdict(t *testing.T) {
	t.Parallel()
	t.Run("PostgreSQL", func(t *testing.T) {
		t.Parallel()
		out, _ := doctorRun(t, pgtest.New(t).DSN)
		wantLine(t, out, "session advisory locks exclude", "yes")
		wantLine(t, out, "transaction advisory locks exclude", "yes")
		wantLine(t, out, "clock_timestamp() advances", "yes")
		wantLine(t, out, "compatibility", "behaves as PostgreSQL")
	})
	t.Run("Liar", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		c := cli{t: t, dsn: db.DSN}
		if _, errOut, code := c.run("migrate"); code != 0 {
			t.Fatalf("migrate: %d %s", code, errOut)
		}
		enginetest.Lie(t, db, engine.SessionLocks, engine.Clock)
		out, code := doctorRun(t, db.DSN, "--need=xact-locks")
		if code != 0 {
			t.Errorf("status %d with --need=xact-locks, want 0", code)
		}
		wantLine(t, out, "session advisory locks exclude", "NO: pg_try_advisory_lock(int8) granted a key another session holds")
		wantLine(t, out, "transaction advisory locks exclude", "yes")
		wantLine(t, out, "clock_timestamp() advances", "NO")
		wantLine(t, out, "compatibility", "NOT COMPATIBLE")
		wantLine(t, out, "feature session-locks", "NOT SAFE")
		wantLine(t, out, "feature leases", "NOT SAFE")
		wantLine(t, out, "feature leader", "NOT SAFE")
		for _, need := range []string{"session-locks", "leases"} {
			if _, code := doctorRun(t, db.DSN, "--need="+need); code != 1 {
				t.Errorf("status %d with --need=%s, want 1", code, need)
			}
		}
	})
}
