package gocronleader_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pglocks/pglocks/gocronleader"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// childDSN, set in a child's environment, makes the test binary a replica
// named "child" that runs until killed.
const childDSN = "GOCRONLEADER_CHILD_DSN"

func child(dsn string) int {
	if _, err := startReplica(dsn, "child", nil); err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	fmt.Println("READY")
	select {} // until killed
}

func closeAll(t *testing.T, rs ...*replica) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, r := range rs {
		if err := r.close(ctx); err != nil {
			t.Errorf("%s: %v", r.name, err)
		}
	}
}

// TestOneReplicaRuns: three replicas' schedulers fire the same job every
// 50 ms; only the leader's runs. When the leader is closed, another
// replica runs the job at once. No two replicas' runs overlap, and terms
// only go forward.
func TestOneReplicaRuns(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := setup(t, ctx)
	tr := newTracker()
	var rs []*replica
	for i := range 3 {
		r, err := startReplica(db.DSN, fmt.Sprint("r", i), tr.add)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	smp := startSampler(rs)
	tr.wait(t, "20 runs", func(runs map[string]int) bool { return total(runs) >= 20 })
	first := runner(t, tr)
	var rest []*replica
	for _, r := range rs {
		if r.name == first {
			closing := time.Now()
			closeAll(t, r)
			tr.wait(t, "a run on another replica", func(runs map[string]int) bool { return total(runs)-runs[first] > 0 })
			t.Logf("leader %s closed: another replica ran the job %v later", first, time.Since(closing).Round(time.Millisecond))
		} else {
			rest = append(rest, r)
		}
	}
	second := ""
	tr.wait(t, "20 runs by the new leader", func(runs map[string]int) bool {
		for name, n := range runs {
			if name != first && n >= 20 {
				second = name
				return true
			}
		}
		return false
	})
	n, err := smp.finish()
	if err != nil {
		t.Error(err)
	}
	t.Logf("%d IsLeader samples, no overlap of trusted terms", n)
	// Counted before the rest are closed: once the second leader is
	// closed, the third replica may lead, and run the job, in its turn.
	tr.mu.Lock()
	if n := total(tr.runs) - tr.runs[first] - tr.runs[second]; n != 0 {
		t.Errorf("a third replica ran the job %d times: %v", n, tr.runs)
	}
	tr.mu.Unlock()
	closeAll(t, rest...)
	checkRuns(t, ctx, db.Conn(t))
}

// TestCrashedLeaderReplaced: the leader is a child process; SIGKILLed, it
// is replaced by one of two in-process replicas, whose scheduler then runs
// the job. No two replicas' runs overlap (by the server clock), and terms
// only go forward.
func TestCrashedLeaderReplaced(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := setup(t, ctx)
	kill := startChild(t, db.DSN)
	conn := db.Conn(t)
	waitFor(t, "5 runs by the child", func() bool {
		var n int
		return conn.QueryRow(ctx, "select count(*) from runs where replica = 'child'").Scan(&n) == nil && n >= 5
	})
	tr := newTracker()
	var rs []*replica
	for i := range 2 {
		r, err := startReplica(db.DSN, fmt.Sprint("r", i), tr.add)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
		waitFor(t, r.name+" campaigning", func() bool { return r.le.State().Running })
	}
	killed := time.Now()
	kill()
	tr.wait(t, "a run after the crash", func(runs map[string]int) bool { return total(runs) > 0 })
	t.Logf("leader SIGKILLed: another replica ran the job %v later", time.Since(killed).Round(time.Millisecond))
	tr.wait(t, "20 runs after the crash", func(runs map[string]int) bool { return total(runs) >= 20 })
	closeAll(t, rs...)
	checkRuns(t, ctx, conn)
}

// TestBadInput: a nil elector is refused; a nil or zero Elector gives
// errors.
func TestBadInput(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := gocronleader.Start(nil); err == nil {
		t.Error("Start(nil) accepted")
	}
	var nilEl *gocronleader.Elector
	if nilEl.IsLeader(ctx) == nil || nilEl.Close(ctx) == nil {
		t.Error("nil Elector: no error")
	}
	if (&gocronleader.Elector{}).IsLeader(ctx) == nil {
		t.Error("zero Elector: IsLeader nil")
	}
}

// TestStartWithoutTable: an election that cannot run — no lease table —
// fails Start, with the cause; gocron would drop IsLeader's error, and the
// campaign never restarts.
func TestStartWithoutTable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.New(t).NewPool(t) // no lease table
	le, err := leader.New(leader.Config{Name: "no-table", Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Close(ctx)
	began := time.Now()
	el, err := gocronleader.Start(le)
	if err == nil {
		_ = el.Close(ctx)
		t.Fatal("Start without a lease table: no error (the campaign fails in the background, and gocron drops IsLeader's error)")
	}
	if !errors.Is(err, lease.ErrNoTable) {
		t.Fatalf("Start without a lease table: %v, want lease.ErrNoTable", err)
	}
	t.Logf("Start without a lease table, after %v: %v", time.Since(began).Round(time.Millisecond), err)
}

func total(runs map[string]int) int {
	n := 0
	for _, v := range runs {
		n += v
	}
	return n
}

// runner returns the one replica that has run the job, failing t if
// several have.
func runner(t *testing.T, tr *tracker) string {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.runs) != 1 {
		t.Fatalf("runs by replica %v, want one replica", tr.runs)
	}
	for name := range tr.runs {
		return name
	}
	return ""
}

// startChild starts a child replica on dsn and returns a func that
// SIGKILLs it and reaps it (also run at cleanup).
func startChild(t *testing.T, dsn string) func() {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childDSN+"="+dsn)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	kill := func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	t.Cleanup(kill)
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if line := sc.Text(); line == "READY" {
			go func() { // drain
				for sc.Scan() {
				}
			}()
			return kill
		} else if strings.HasPrefix(line, "ERROR") {
			t.Fatalf("child: %s", line)
		}
	}
	t.Fatal("the child exited before it was ready")
	return nil
}

// waitFor polls cond until it holds, for up to a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	delay := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		timer := time.NewTimer(delay)
		<-timer.C
		delay = min(2*delay, 50*time.Millisecond)
	}
}

// TestCampaignStops: the lease table is dropped under a running leader:
// the campaign stops for good, Done is closed and Err says why, and
// IsLeader returns it; after Close, Err is that error still.
func TestCampaignStops(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := setup(t, ctx)
	le, err := leader.New(leader.Config{Name: "stops", Pool: db.NewPool(t), TTL: 2 * time.Second, RetryInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Close(ctx)
	el, err := gocronleader.Start(le)
	if err != nil {
		t.Fatal(err)
	}
	defer el.Close(ctx)
	waitFor(t, "leadership", func() bool { return el.IsLeader(ctx) == nil })
	select {
	case <-el.Done():
		t.Fatal("Done closed while the campaign runs")
	default:
	}
	if el.Err() != nil {
		t.Fatalf("Err while the campaign runs: %v", el.Err())
	}
	if _, err := db.Conn(t).Exec(ctx, "drop table pglocks_leases"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-el.Done():
	case <-time.After(time.Minute):
		t.Fatal("the campaign did not stop within a minute of its table's drop")
	}
	if !errors.Is(el.Err(), lease.ErrNoTable) || !errors.Is(el.IsLeader(ctx), lease.ErrNoTable) {
		t.Fatalf("after the drop: Err %v, IsLeader %v; want lease.ErrNoTable", el.Err(), el.IsLeader(ctx))
	}
	t.Logf("campaign stopped: %v", el.Err())
}
