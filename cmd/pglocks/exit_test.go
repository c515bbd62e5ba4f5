package main_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

// Bad input is a usage error (64), an unknown lease its own status (66),
// never 69 ("the database cannot be reached"); no message says "pglocks:"
// twice.
func TestExitCodesForBadInput(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	if _, errOut, code := c.run("migrate"); code != 0 {
		t.Fatalf("migrate: %d %s", code, errOut)
	}
	cases := []struct {
		args []string
		want int
	}{
		{[]string{"run", "--lease", "--ttl", "48h", "x", "--", "true"}, 64},
		{[]string{"run", "--lease", "--ttl", "500us", "x", "--", "true"}, 64},
		{[]string{"run", "--lease", strings.Repeat("n", 1100), "--", "true"}, 64},
		{[]string{"break", "never-acquired"}, 66},
		{[]string{"key", ""}, 64},
	}
	for _, tc := range cases {
		_, errOut, code := c.run(tc.args...)
		name := strings.Join(tc.args, " ")
		name = name[:min(len(name), 60)]
		if code != tc.want {
			t.Errorf("pglocks %s: status %d, want %d (stderr %q)", name, code, tc.want, errOut)
		}
		if strings.Contains(errOut, "pglocks: pglocks:") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("pglocks %s: stderr %q, want one line with one prefix", name, errOut)
		}
	}
}

// run --wait goes on waiting when its session is terminated, and runs CMD
// once the holder is done.
func TestRunWaitSurvivesSessionDeath(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	c := cli{t: t, dsn: db.DSN}
	first := c.hold([]string{"run", "contended"}, waitForStdin)
	second := c.command("run", "--wait", "1m", "contended", "--", "echo", "second")
	var out strings.Builder
	second.Stdout = &out
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- second.Wait() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := db.Conn(t)
	// The holder's session and listener, and the waiter's session: the
	// waiter is trying.
	// This database's sessions only: other tests run "pglocks run" on the
	// same server in theirs (terminating those failed TestRunExitStatus in
	// a CI loop).
	notHolding := `select pid from pg_stat_activity where application_name = 'pglocks run'
		and datname = current_database()
		and pid not in (select pid from pg_locks where locktype = 'advisory' and granted)`
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := conn.QueryRow(ctx, "select count(*) from pg_stat_activity where application_name = 'pglocks run' and datname = current_database()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter never connected")
		}
		tick := time.NewTimer(20 * time.Millisecond)
		<-tick.C
	}
	rows, err := conn.Query(ctx, notHolding)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		_ = db.Server.TerminateBackend(ctx, uint32(pid))
	}
	select {
	case err := <-done:
		t.Fatalf("the waiting run exited while the lock was held: %v (status %d)", err, second.ProcessState.ExitCode())
	case <-time.After(time.Second): // the waiter retries every ≤ 100ms
	}
	first.stdin.Close()
	first.wait(t)
	if err := <-done; err != nil || out.String() != "second\n" {
		t.Fatalf("waiting run after its session was terminated: %v, %q", err, out.String())
	}
}
