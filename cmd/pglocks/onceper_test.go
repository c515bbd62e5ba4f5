package main_test

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestRunOncePer: three pglocks run --once-per started together, round
// after round, over several 2s slots: each slot is run by one of them;
// the others exit 79 and print nothing. The run history
// in pglocks status says each slot succeeded.
func TestRunOncePer(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	if _, errOut, code := c.run("migrate"); code != 0 {
		t.Fatalf("migrate: %d %s", code, errOut)
	}
	const slots = 3
	ran := map[string]int{} // slot → runs
	deadline := time.Now().Add(2 * time.Minute)
	rounds := 0
	for len(ran) < slots+1 { // the first slot may have started before us
		if time.Now().After(deadline) {
			t.Fatalf("after %d rounds, runs per slot %v", rounds, ran)
		}
		rounds++
		var cmds [3]*exec.Cmd
		var outs, errs [3]strings.Builder
		for i := range cmds {
			cmds[i] = c.command("run", "--once-per", "2s", "nightly", "--", "sh", "-c", `echo "$PGLOCKS_SLOT"`)
			cmds[i].Stdout, cmds[i].Stderr = &outs[i], &errs[i]
			if err := cmds[i].Start(); err != nil {
				t.Fatal(err)
			}
		}
		for i, cmd := range cmds {
			_ = cmd.Wait()
			code := cmd.ProcessState.ExitCode()
			switch {
			case code == 0 && errs[i].Len() == 0 && outs[i].Len() > 0:
				ran[strings.TrimSpace(outs[i].String())]++
			case code == 79 && errs[i].Len() == 0 && outs[i].Len() == 0:
			default:
				t.Fatalf("round %d, process %d: status %d, stdout %q, stderr %q; want 0 and the slot, or 79 and nothing",
					rounds, i, code, outs[i].String(), errs[i].String())
			}
		}
	}
	for slot, n := range ran {
		if n != 1 {
			t.Errorf("slot %s run %d times, want once (runs per slot: %v)", slot, n, ran)
		}
	}
	t.Logf("%d rounds of 3 processes, runs per slot: %v", rounds, ran)
	out, errOut, code := c.run("status", "--json")
	if code != 0 {
		t.Fatalf("status: %d %s", code, errOut)
	}
	var st struct {
		Runs []struct{ Job, Slot, Outcome string }
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	recorded := map[string]string{}
	for _, r := range st.Runs {
		if r.Job == "nightly" {
			recorded[r.Slot] = r.Outcome
		}
	}
	for slot := range ran {
		if recorded[slot] != "succeeded" {
			t.Errorf("slot %s: history says %q, want succeeded (history %v)", slot, recorded[slot], recorded)
		}
	}
}

// TestRunOncePerOutcome: CMD's status is the run's outcome in the
// history, -v names who ran a taken slot, -E sets a taken slot's status.
func TestRunOncePerOutcome(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	if _, errOut, code := c.run("migrate"); code != 0 {
		t.Fatalf("migrate: %d %s", code, errOut)
	}
	if _, errOut, code := c.run("run", "--once-per", "1h", "report", "--", "sh", "-c", "exit 3"); code != 3 || errOut != "" {
		t.Fatalf("failing CMD: status %d, stderr %q; want 3 and nothing", code, errOut)
	}
	if _, errOut, code := c.run("run", "-E", "0", "--once-per", "1h", "report", "--", "true"); code != 0 || errOut != "" {
		t.Fatalf("-E 0, slot taken: status %d, stderr %q", code, errOut)
	}
	if _, errOut, code := c.run("-v", "run", "--once-per", "1h", "report", "--", "true"); code != 79 || !strings.Contains(errOut, "failed") {
		t.Fatalf("-v, slot taken: status %d, stderr %q; want 79 and who ran it", code, errOut)
	}
	out, _, _ := c.run("status")
	if !strings.Contains(out, "report") || !strings.Contains(out, "failed") {
		t.Errorf("status does not show the failed run:\n%s", out)
	}
	bare := newCLI(t)
	if _, errOut, code := bare.run("run", "--once-per", "1h", "x", "--", "true"); code != 78 || !strings.Contains(errOut, "pglocks migrate") {
		t.Errorf("--once-per without migrate: status %d, stderr %q; want 78 naming pglocks migrate", code, errOut)
	}
}

// TestMigrateAndStatusName: status names a missing table and the command
// that creates it; migrate creates the lease table and the run table
// (--schema, --table, --run-table too); doctor --need schedule checks the
// run table.
func TestMigrateAndStatusName(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	out, errOut, code := c.run("status")
	if code != 0 || !strings.Contains(out, "no lease table (run pglocks migrate)") ||
		!strings.Contains(out, "no run table (run pglocks migrate)") {
		t.Errorf("status before migrate: %d %q, stdout:\n%s\nwant the missing tables named", code, errOut, out)
	}
	out, _, _ = c.run("status", "--json")
	if !strings.Contains(out, `"missing"`) || !strings.Contains(out, "pglocks migrate") {
		t.Errorf("status --json before migrate does not name the missing tables:\n%s", out)
	}
	if _, _, code := c.run("doctor", "--need", "schedule"); code != 1 {
		t.Errorf("doctor --need schedule before migrate: status %d, want 1", code)
	}
	if out, errOut, code := c.run("migrate"); code != 0 || !strings.Contains(out, "pglocks_runs") {
		t.Fatalf("migrate: %d %q %q", code, out, errOut)
	}
	if out, _, code := c.run("doctor", "--need", "schedule"); code != 0 || !strings.Contains(out, "pglocks_runs") {
		t.Errorf("doctor --need schedule after migrate: status %d, stdout:\n%s", code, out)
	}
	custom := []string{"--schema", "jobs", "--table", "locks", "--run-table", "runs"}
	if _, errOut, code := c.run(append([]string{"migrate"}, custom...)...); code != 0 {
		t.Fatalf("migrate %v: %d %q", custom, code, errOut)
	}
	args := append(append([]string{"run", "--once-per", "1h"}, custom...), "custom", "--", "true")
	if _, errOut, code := c.run(args...); code != 0 {
		t.Fatalf("run %v: %d %q", args, code, errOut)
	}
	out, _, _ = c.run(append([]string{"status"}, custom...)...)
	if !strings.Contains(out, "custom") || !strings.Contains(out, "succeeded") {
		t.Errorf("status %v does not show the run:\n%s", custom, out)
	}
}

// TestRunOncePerLoss: a run whose job lease is broken stops its job and
// exits 76, and the history says lost.
func TestRunOncePerLoss(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	if _, errOut, code := c.run("migrate"); code != 0 {
		t.Fatalf("migrate: %d %s", code, errOut)
	}
	h := c.hold([]string{"run", "--once-per", "1h", "--ttl", "1h", "stuck"}, `trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done`)
	if out, errOut, code := c.run("break", "schedule:stuck"); code != 0 {
		t.Fatalf("break: %d %q %q", code, out, errOut)
	}
	if code := h.wait(t); code != 76 {
		t.Fatalf("holder of a broken job lease: status %d, want 76", code)
	}
	if out, _, _ := c.run("status", "stuck"); !strings.Contains(out, "lost") {
		t.Errorf("status after the loss:\n%s\nwant the run recorded lost", out)
	}
}
