package schedule_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/schedule"
)

// The killed run's job: one slot per hour, and a lease of one second, so
// that a dead run frees the job soon.
const (
	killJob    = "killed"
	killPeriod = time.Hour
	killTTL    = time.Second
)

// runChild runs a replica process when the test binary is started as one
// (SCHEDULE_CHILD_DSN set): it starts the current slot of killJob, prints
// "RUNNING <slot> <token>" and works until it is killed.
func runChild() bool {
	dsn := os.Getenv("SCHEDULE_CHILD_DSN")
	if dsn == "" {
		return false
	}
	if err := child(dsn); err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	os.Exit(0)
	return true
}

func child(dsn string) error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	store, err := lease.New(pool, lease.Config{Hostname: "child"})
	if err != nil {
		return err
	}
	runner, err := schedule.New(schedule.Config{Store: store, Pool: pool})
	if err != nil {
		return err
	}
	job, err := runner.Job(killJob, schedule.Policy{Period: killPeriod, TTL: killTTL,
		RerunCrashed: os.Getenv("SCHEDULE_CHILD_RERUN") != ""})
	if err != nil {
		return err
	}
	run, err := job.Start(ctx)
	if err != nil {
		return err
	}
	fmt.Println("RUNNING", run.Record().Slot, run.Record().Token)
	<-make(chan struct{}) // the job's long work, cut short by SIGKILL
	return nil
}

// spawnAndKill starts a child replica, waits until it runs the current
// slot of killJob, kills it with SIGKILL and returns the slot and the
// killed run's token.
func spawnAndKill(t *testing.T, db *pgtest.DB, rerun bool) (string, int64) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SCHEDULE_CHILD_DSN="+db.DSN)
	if rerun {
		cmd.Env = append(cmd.Env, "SCHEDULE_CHILD_RERUN=1")
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var line string
	select {
	case line = <-lines:
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		t.Fatal("the child did not start its run within a minute")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for range lines { // the reader ends with the pipe
	}
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "RUNNING" {
		t.Fatalf("child: %q", line)
	}
	token, _ := strconv.ParseInt(f[2], 10, 64)
	return f[1], token
}

// TestKilledRun: a replica is killed (SIGKILL) in the middle of its run.
// The slot stays taken: five replicas asking for it, before and after the
// dead run's lease expired, do not run it, and learn that it crashed; the
// history says so; the job's next slot runs as usual.
func TestKilledRun(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := pgtest.New(t)
	var rs []*replica
	for i := range 5 {
		rs = append(rs, newReplica(t, db, fmt.Sprintf("r%d", i), time.Duration(i-2)*time.Second))
	}
	policy := schedule.Policy{Period: killPeriod, TTL: killTTL}
	awaitRoom(t, rs[0].pool, killPeriod, rs[0].job(t, killJob, policy).Policy().Tolerance, 30*time.Second)
	slot, token := spawnAndKill(t, db, false)
	killed := time.Now()
	var outcomes []schedule.Outcome
	deadline := time.Now().Add(time.Minute)
	poll := time.NewTicker(50 * time.Millisecond) // rounds of starts, until the dead run's lease expires
	defer poll.Stop()
	for ; ; <-poll.C {
		got := startAll(ctx, t, rs, policy)
		for _, te := range got {
			if te == nil || te.Slot != slot || te.By.Token != token || te.By.Hostname != "child" {
				t.Fatalf("start of the dead run's slot: %+v, want taken by the child's token %d", te, token)
			}
		}
		outcomes = append(outcomes, got[0].By.Outcome)
		if got[0].By.Outcome == schedule.Crashed || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("after SIGKILL: %d rounds of 5 starts reported the dead run as running, then crashed %v after the kill (lease TTL %v)",
		len(outcomes)-1, time.Since(killed).Round(time.Millisecond), killTTL)
	if last := outcomes[len(outcomes)-1]; last != schedule.Crashed {
		t.Fatalf("outcomes %v, want crashed once the lease expired", outcomes)
	}
	h, err := rs[0].runner.History(ctx, killJob, 5)
	if err != nil || len(h) != 1 || h[0].Outcome != schedule.Crashed || h[0].Slot != slot || !h[0].End.IsZero() {
		t.Fatalf("history: %v %+v", err, h)
	}
	// The next slot runs, and records the crash for good: with a longer TTL
	// than the dead run's, which a loaded machine could let lapse mid-run.
	job := rs[1].job(t, killJob, schedule.Policy{Period: killPeriod, TTL: 30 * time.Second})
	if _, err := job.DoSlot(ctx, "next", rs[1].work); err != nil {
		t.Fatal(err)
	}
	var stored string
	if err := rs[0].pool.QueryRow(ctx, `select outcome from pglocks_runs where job = $1 and token = $2`,
		pgx.QueryExecModeExec, killJob, token).Scan(&stored); err != nil || stored != "crashed" {
		t.Fatalf("the dead run's row: %q, %v", stored, err)
	}
}

// TestKilledRunRerun: with RerunCrashed, the slot of a run killed with
// SIGKILL runs again once the dead run's lease has expired — once, though
// five replicas keep asking — and the history shows both runs.
func TestKilledRunRerun(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := pgtest.New(t)
	var rs []*replica
	for i := range 5 {
		rs = append(rs, newReplica(t, db, fmt.Sprintf("r%d", i), time.Duration(2-i)*time.Second))
	}
	// The replicas' own runs hold the job for 30 s, renewed: the dead run's
	// lease is the child's, of killTTL. A rerun under a lease of killTTL
	// too would be lost whenever a loaded machine let its renewals lapse
	// for 0.9 s (its trust deadline), and recorded as lost, not succeeded.
	policy := schedule.Policy{Period: killPeriod, TTL: 30 * time.Second, RerunCrashed: true}
	awaitRoom(t, rs[0].pool, killPeriod, rs[0].job(t, killJob, policy).Policy().Tolerance, 30*time.Second)
	slot, token := spawnAndKill(t, db, true)
	killed := time.Now()
	reran, rounds := 0, 0
	poll := time.NewTicker(50 * time.Millisecond) // rounds of starts, until the dead run's lease expires
	defer poll.Stop()
	for deadline := time.Now().Add(time.Minute); reran == 0 && time.Now().Before(deadline); rounds++ {
		if rounds > 0 {
			<-poll.C
		}
		for _, te := range startAll(ctx, t, rs, policy) {
			if te == nil {
				reran++
			} else if te.Slot != slot {
				t.Fatalf("taken: %+v, want slot %s", te, slot)
			}
		}
	}
	for range 3 { // and never again
		for _, te := range startAll(ctx, t, rs, policy) {
			if te == nil {
				reran++
			}
		}
	}
	if reran != 1 {
		t.Fatalf("the dead run's slot ran %d more times, want 1", reran)
	}
	t.Logf("after SIGKILL: rerun once, %v after the kill (lease TTL %v), after %d rounds of 5 starts",
		time.Since(killed).Round(time.Millisecond), killTTL, rounds)
	h, err := rs[0].runner.History(ctx, killJob, 5)
	if err != nil || len(h) != 2 || h[1].Token != token || h[1].Outcome != schedule.Crashed ||
		h[0].Outcome != schedule.Succeeded || h[0].Slot != slot || h[1].Slot != slot {
		t.Fatalf("history: %v %+v", err, h)
	}
	for _, rec := range h {
		t.Logf("history: %v", rec)
	}
	if n := doneCount(t, rs[0].pool, killJob, slot); n != 1 {
		t.Fatalf("the rerun wrote %d rows", n)
	}
}

// startAll has every replica start killJob's current slot at once; a run
// is done (its work written) and reported as nil, a taken slot as its
// TakenError.
func startAll(ctx context.Context, t *testing.T, rs []*replica, p schedule.Policy) []*schedule.TakenError {
	t.Helper()
	out := make([]*schedule.TakenError, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		job := r.job(t, killJob, p)
		wg.Go(func() {
			_, err := job.Do(ctx, r.work)
			if err != nil && !errors.As(err, &out[i]) {
				t.Errorf("%s: %v", r.name, err)
			}
		})
	}
	wg.Wait()
	return out
}
