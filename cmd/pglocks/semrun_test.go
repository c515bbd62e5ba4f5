package main_test

import (
	"encoding/json"
	"strings"
	"testing"
)

// run --max N runs at most N commands of NAME at once, refuses (75) or
// waits for the next, and status shows the semaphore's permits.
func TestRunMax(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	first := c.hold([]string{"run", "--max", "2", "pool"}, waitForStdin)
	second := c.hold([]string{"run", "--max", "2", "pool"}, waitForStdin)
	out, errOut, code := c.run("run", "--max", "2", "pool", "--", "echo", "ran")
	if code != 75 || out != "" || !strings.Contains(errOut, "all 2 permits are held") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("third run of --max 2: status %d, stdout %q, stderr %q; want 75 and one line", code, out, errOut)
	}
	// A plain run of the same NAME is another lock.
	if out, _, code := c.run("run", "pool", "--", "echo", "plain"); code != 0 || out != "plain\n" {
		t.Fatalf("plain run beside --max: %d %q", code, out)
	}
	js, errOut, code := c.run("status", "--json", "pool")
	if code != 0 {
		t.Fatalf("status: %d %s", code, errOut)
	}
	var st struct {
		Advisory []struct {
			Name    string
			Granted bool
		}
		Semaphore *struct {
			Name    string
			Held    int
			Permits []struct{ Slot int }
		}
	}
	if err := json.Unmarshal([]byte(js), &st); err != nil {
		t.Fatalf("%v: %s", err, js)
	}
	if st.Semaphore == nil || st.Semaphore.Held != 2 || len(st.Semaphore.Permits) != 2 || len(st.Advisory) != 2 ||
		!strings.HasPrefix(st.Advisory[0].Name, "pool (semaphore permit ") {
		t.Fatalf("status --json pool: %s", js)
	}
	text, _, _ := c.run("status", "pool")
	if !strings.Contains(text, "SEMAPHORE pool") || !strings.Contains(text, "2 permits held") {
		t.Fatalf("status pool:\n%s", text)
	}
	waiter := c.command("run", "--max", "2", "--wait", "1m", "pool", "--", "echo", "third")
	var wout strings.Builder
	waiter.Stdout = &wout
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	first.stdin.Close()
	if err := waiter.Wait(); err != nil || wout.String() != "third\n" {
		t.Fatalf("waiting run: %v, %q", err, wout.String())
	}
	second.stdin.Close()
	first.wait(t)
	second.wait(t)
}

// run -s holds NAME shared: shared runs run together, an exclusive run is
// refused while they run and, with --wait, runs once they are done.
func TestRunShared(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	r1 := c.hold([]string{"run", "-s", "config"}, waitForStdin)
	r2 := c.hold([]string{"run", "--shared", "config"}, waitForStdin)
	if _, errOut, code := c.run("run", "config", "--", "true"); code != 75 || !strings.Contains(errOut, "held elsewhere") {
		t.Fatalf("exclusive run beside readers: %d %q, want 75", code, errOut)
	}
	text, _, _ := c.run("status", "config")
	if strings.Count(text, "Share") != 2 {
		t.Fatalf("status config, want two shared holders:\n%s", text)
	}
	writer := c.command("run", "--wait", "1m", "config", "--", "echo", "writer")
	var out strings.Builder
	writer.Stdout = &out
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	r1.stdin.Close()
	r2.stdin.Close()
	if err := writer.Wait(); err != nil || out.String() != "writer\n" {
		t.Fatalf("waiting exclusive run: %v, %q", err, out.String())
	}
	r1.wait(t)
	r2.wait(t)
}

// -s and --max exclude each other and the lease modes; --max must be 1 or
// more.
func TestRunModeUsage(t *testing.T) {
	t.Parallel()
	c := cli{t: t, dsn: "postgres://nobody@127.0.0.1:1/none"}
	for _, args := range [][]string{
		{"--max", "0"}, {"--max", "-1"}, {"--max", "2000"}, {"-s", "--max", "2"},
		{"--max", "2", "--lease"}, {"-s", "--lease"}, {"-s", "--once-per", "1h"},
	} {
		_, errOut, code := c.run(append(append([]string{"run"}, args...), "x", "--", "true")...)
		if code != 64 || !strings.Contains(errOut, "run:") {
			t.Errorf("run %v: %d %q, want 64", args, code, errOut)
		}
	}
}
