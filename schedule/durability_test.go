package schedule_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/schedule"
)

// TestRunSurvivesCrash: a run's mark and end commit durably whatever the
// session's synchronous_commit. A private server whose WAL writer and
// background writer are stopped (SIGSTOP), so that nothing but a
// synchronous commit flushes the WAL; sessions at synchronous_commit =
// off; a run of a slot, acknowledged from start to end; then both writers
// are SIGKILLed — a crash: the postmaster recovers from the WAL on disk.
// After recovery the run table must still show the run, succeeded: a lost
// mark would let the slot run again, a lost end leave it crashed (which
// RerunCrashed runs again).
func TestRunSurvivesCrash(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t)
	if srv.Mode() != pgtest.ModeLocal {
		t.Skipf("needs a local server to crash (have %s)", srv.Mode())
	}
	ctx := ctxT(t)
	db := srv.NewDB(t)
	pool := db.NewPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
		c.MaxConns = 2
	})
	store, err := lease.New(pool, lease.Config{Hostname: "r"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close(context.Background()) })
	runner, err := schedule.New(schedule.Config{Store: store, Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	if err := runner.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	job, err := runner.Job("durable", schedule.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	killWriters := stopWriters(t, pool)
	witness := db.Conn(t)
	rec, err := job.DoSlot(ctx, "s", func(context.Context, *schedule.Run) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	killWriters()
	awaitCrash(t, witness, pool)
	var outcome string
	waitFor(t, "the run table after recovery", func() bool {
		err = pool.QueryRow(ctx, `select coalesce((select outcome from pglocks_runs where job = 'durable' and slot = 's'), 'no row')`,
			pgx.QueryExecModeExec).Scan(&outcome)
		return err == nil
	})
	if outcome != string(schedule.Succeeded) {
		t.Fatalf("after a crash the run of token %d shows %q, want succeeded: its record was lost", rec.Token, outcome)
	}
	h, err := runner.History(ctx, "durable", 5)
	if err != nil || len(h) != 1 || h[0].Token != rec.Token {
		t.Fatalf("history after the crash: %v %+v", err, h)
	}
}

// stopWriters stops (SIGSTOP) the server's WAL writer and background
// writer, so that only a synchronous commit flushes the WAL, and returns a
// function that SIGKILLs them: a crash. Should the test end before that,
// they are continued at cleanup. (lease/durability_test.go's pattern.)
func stopWriters(t *testing.T, pool *pgxpool.Pool) (kill func()) {
	t.Helper()
	rows, _ := pool.Query(ctxT(t), `select pid from pg_stat_activity where backend_type in ('walwriter', 'background writer')`,
		pgx.QueryExecModeExec)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(pids) != 2 {
		t.Fatalf("the server's writers: %v, %v", pids, err)
	}
	killed := false
	for _, pid := range pids {
		if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
			t.Skipf("cannot signal the server's writers: %v", err)
		}
		t.Cleanup(func() {
			if !killed { // else the pid may name another process by now
				_ = syscall.Kill(int(pid), syscall.SIGCONT)
			}
		})
	}
	return func() {
		killed = true
		for _, pid := range pids {
			if err := syscall.Kill(int(pid), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// awaitCrash returns once the postmaster has ended the witness session,
// opened before a crash began, so that no later connection can reach the
// server before its recovery, and drops pool's sessions, which died too.
func awaitCrash(t *testing.T, witness *pgx.Conn, pool *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitFor(t, "the crash to end the witness session", func() bool {
		_, err := witness.Exec(ctx, "select 1")
		return err != nil
	})
	pool.Reset()
}

// waitFor polls cond, backing off up to 50 ms, until it holds, for up to
// a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	delay := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-time.After(delay)
		delay = min(2*delay, 50*time.Millisecond)
	}
}
