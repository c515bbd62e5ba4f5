package main_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

// doctorRun runs pglocks doctor on dsn and returns its output and status.
func doctorRun(t *testing.T, dsn string, args ...string) (string, int) {
	t.Helper()
	out, errOut, code := cli{t: t, dsn: dsn}.run(append([]string{"doctor"}, args...)...)
	t.Logf("pglocks doctor %s → %d\n%s%s", strings.Join(args, " "), code, out, errOut)
	return out, code
}

func wantLine(t *testing.T, out, prefix, contains string) {
	t.Helper()
	for line := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(line, prefix) {
			if !strings.Contains(line, contains) {
				t.Errorf("doctor: %q, want it to say %q", line, contains)
			}
			return
		}
	}
	t.Errorf("doctor printed no %q line", prefix)
}

// TestDoctor: doctor tells a direct connection, a session-mode PgBouncer
// and a transaction-mode PgBouncer apart by what really happens through
// them, and its status says whether the features asked for are safe.
func TestDoctor(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	c := cli{t: t, dsn: db.DSN}
	if _, errOut, code := c.run("migrate"); code != 0 {
		t.Fatalf("migrate: %d %s", code, errOut)
	}
	all := "--need=session-locks,xact-locks,leases,listen,leader"
	t.Run("Direct", func(t *testing.T) {
		out, code := doctorRun(t, db.DSN, all)
		if code != 0 {
			t.Errorf("status %d, want 0", code)
		}
		wantLine(t, out, "pooler", "direct")
		wantLine(t, out, "server", "primary")
		wantLine(t, out, "session lock kept", "yes")
		wantLine(t, out, "NOTIFY arrives", "yes")
		wantLine(t, out, "lease table", "present")
		wantLine(t, out, "synchronous_commit", "on")
	})
	t.Run("SessionBouncer", func(t *testing.T) {
		_, dsn := db.Bouncer(t, pgtest.PoolSession)
		out, code := doctorRun(t, dsn, all)
		if code != 0 {
			t.Errorf("status %d, want 0", code)
		}
		wantLine(t, out, "pooler", "session mode")
		wantLine(t, out, "session lock kept", "yes")
		wantLine(t, out, "NOTIFY arrives", "yes")
	})
	t.Run("TransactionBouncer", func(t *testing.T) {
		_, dsn := db.Bouncer(t, pgtest.PoolTransaction)
		out, code := doctorRun(t, dsn, "--need=xact-locks,leases,leader")
		if code != 0 {
			t.Errorf("status %d with --need=xact-locks,leases,leader, want 0", code)
		}
		wantLine(t, out, "pooler", "transaction mode")
		wantLine(t, out, "session lock kept", "no")
		wantLine(t, out, "feature session-locks", "NOT SAFE")
		wantLine(t, out, "feature listen", "NOT SAFE")
		wantLine(t, out, "feature leases", "safe")
		wantLine(t, out, "feature leader", "safe: lease-only campaign")
		if _, code := doctorRun(t, dsn, "--need=session-locks"); code != 1 {
			t.Errorf("status %d with --need=session-locks, want 1", code)
		}
	})
	// Statement pooling was once reported as transaction pooling, and
	// xact-locks, leases and leader as safe, though its every BEGIN ends
	// the connection.
	t.Run("StatementBouncer", func(t *testing.T) {
		_, dsn := db.Bouncer(t, pgtest.PoolStatement)
		out, code := doctorRun(t, dsn, "--need=xact-locks")
		if code != 1 {
			t.Errorf("status %d with --need=xact-locks behind statement pooling, want 1", code)
		}
		wantLine(t, out, "pooler", "statement mode")
		wantLine(t, out, "transactions", "no")
		for _, f := range []string{"session-locks", "xact-locks", "leases", "leader", "listen"} {
			wantLine(t, out, "feature "+f, "NOT SAFE")
		}
	})
	// Pgpool-II in raw mode leaves extended-protocol DML (pgx's default)
	// in a transaction it never commits: a lease release would not count.
	t.Run("Pgpool", func(t *testing.T) {
		_, dsn := db.Pgpool(t, true)
		out, code := doctorRun(t, dsn, "--need=leases")
		if code != 1 {
			t.Errorf("status %d with --need=leases through Pgpool-II and the extended protocol, want 1", code)
		}
		wantLine(t, out, "autocommitted writes committed", "no")
		wantLine(t, out, "feature leases", "simple_protocol")
		out, code = doctorRun(t, dsn+"&default_query_exec_mode=simple_protocol", "--need=session-locks,leases,listen,leader")
		if code != 0 {
			t.Errorf("status %d through Pgpool-II with the simple protocol, want 0", code)
		}
		wantLine(t, out, "autocommitted writes committed", "yes")
	})
	// A transaction check that cannot even connect is not a refusal of
	// transactions ("not tried", never "a BEGIN ends the connection"). The
	// engine probe cannot open its second connection either, so it decides
	// nothing about transaction locks, and undecided is not safe:
	// xact-locks is NOT SAFE, saying why.
	t.Run("ConnectionLimit", func(t *testing.T) {
		conn := db.Conn(t)
		ctx := t.Context()
		role := "doctor_limit_" + db.Name
		if _, err := conn.Exec(ctx, "create role "+pgx.Identifier{role}.Sanitize()+" login connection limit 2"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = db.Conn(t).Exec(context.Background(), "drop role "+pgx.Identifier{role}.Sanitize())
		})
		out, code := doctorRun(t, strings.Replace(db.DSN, "postgres@", role+"@", 1), "--need=xact-locks")
		if code != 1 {
			t.Errorf("status %d with --need=xact-locks for a role limited to 2 connections, want 1", code)
		}
		wantLine(t, out, "transactions", "not tried")
		wantLine(t, out, "feature xact-locks", "NOT SAFE: not decided: engine probe: second connection")
	})
	t.Run("NoPrivilege", func(t *testing.T) {
		conn := db.Conn(t)
		ctx := t.Context()
		role := "doctor_" + db.Name // roles are cluster-wide
		if _, err := conn.Exec(ctx, "create role "+pgx.Identifier{role}.Sanitize()+" login"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = db.Conn(t).Exec(context.Background(), "drop role "+pgx.Identifier{role}.Sanitize())
		})
		out, code := doctorRun(t, strings.Replace(db.DSN, "postgres@", role+"@", 1), "--need=leases")
		if code != 1 {
			t.Errorf("status %d for a role without privileges, want 1", code)
		}
		wantLine(t, out, "lease table", "missing privilege SELECT, INSERT, UPDATE")
	})
	t.Run("BadFlags", func(t *testing.T) {
		if _, code := doctorRun(t, db.DSN, "--need=teleport"); code != 64 {
			t.Errorf("unknown feature: status %d, want 64", code)
		}
	})
}
