package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/pgtest"
)

var binary string

// helpers are roles this test binary plays when run with
// PGLOCKS_TEST_HELPER set to one's name (a process the tests need).
var helpers = map[string]func() int{}

func TestMain(m *testing.M) {
	if h := helpers[os.Getenv("PGLOCKS_TEST_HELPER")]; h != nil {
		os.Exit(h())
	}
	dir, err := os.MkdirTemp("", "pglocks-cli-")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "pglocks")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		panic("go build: " + err.Error() + "\n" + string(out))
	}
	code := pgtest.WrapMain(m).Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// cli is the built binary run against one database.
type cli struct {
	t   *testing.T
	dsn string
}

func newCLI(t *testing.T) cli {
	t.Helper()
	return cli{t: t, dsn: pgtest.New(t).DSN}
}

func (c cli) command(args ...string) *exec.Cmd {
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+c.dsn)
	return cmd
}

// run runs pglocks to completion and returns stdout, stderr and the status.
func (c cli) run(args ...string) (string, string, int) {
	c.t.Helper()
	cmd := c.command(args...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		c.t.Fatal(err)
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}

// holder is a `pglocks run` whose CMD has said "ready" and waits for its
// stdin to close.
type holder struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
	errc  chan error
}

// hold starts pglocks run ARGS -- sh -c SCRIPT, where SCRIPT prints ready
// and then waits; it returns once CMD is running under the lock.
func (c cli) hold(args []string, script string) *holder {
	c.t.Helper()
	return c.holdArgv(args, "sh", "-c", script)
}

// holdArgv starts pglocks run ARGS -- ARGV, where ARGV prints ready first;
// it returns once CMD is running under the lock.
func (c cli) holdArgv(args []string, argv ...string) *holder {
	c.t.Helper()
	return c.holdCmd(c.command(append(append(args, "--"), argv...)...))
}

// holdCmd starts cmd, a pglocks run (perhaps under a wrapper) whose CMD
// prints ready first; it returns once CMD is running under the lock.
func (c cli) holdCmd(cmd *exec.Cmd) *holder {
	c.t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	h := &holder{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout), errc: make(chan error, 1)}
	if !h.out.Scan() || h.out.Text() != "ready" {
		_ = cmd.Process.Kill()
		c.t.Fatalf("CMD did not start under the lock: %q", h.out.Text())
	}
	go func() {
		for h.out.Scan() { // drain the rest
		}
		h.errc <- cmd.Wait()
	}()
	c.t.Cleanup(func() { _ = cmd.Process.Kill() })
	return h
}

// wait returns the holder's exit status.
func (h *holder) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-h.errc:
		return h.cmd.ProcessState.ExitCode()
	case <-time.After(time.Minute):
		t.Fatal("pglocks run did not exit")
		return -1
	}
}

const waitForStdin = `echo ready; read line; exit 0`

func TestRunExcludes(t *testing.T) {
	t.Parallel()
	for _, mode := range [][]string{{}, {"--lease", "--ttl", "30s"}} {
		t.Run("Mode"+strings.Join(mode, ""), func(t *testing.T) {
			t.Parallel()
			c := newCLI(t)
			if len(mode) > 0 {
				if _, errOut, code := c.run("migrate"); code != 0 {
					t.Fatalf("migrate: %d %s", code, errOut)
				}
			}
			first := c.hold(append([]string{"run"}, append(mode, "nightly")...), waitForStdin)
			out, errOut, code := c.run(append([]string{"run"}, append(mode, "nightly", "--", "echo", "ran")...)...)
			if code != 75 || out != "" || !strings.Contains(errOut, "held") || strings.Count(errOut, "\n") != 1 {
				t.Fatalf("second run while held: status %d, stdout %q, stderr %q; want 75 and one line", code, out, errOut)
			}
			_, _, code = c.run(append([]string{"run", "--wait", "200ms"}, append(mode, "nightly", "--", "true")...)...)
			if code != 75 {
				t.Fatalf("--wait that runs out: status %d, want 75", code)
			}
			first.stdin.Close()
			if code := first.wait(t); code != 0 {
				t.Fatalf("first run: status %d", code)
			}
			if out, _, code := c.run(append([]string{"run"}, append(mode, "nightly", "--", "echo", "ran")...)...); code != 0 || out != "ran\n" {
				t.Fatalf("after release: %d %q", code, out)
			}
		})
	}
}

func TestRunWaitsForRelease(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	first := c.hold([]string{"run", "job"}, waitForStdin)
	second := c.command("run", "--wait", "1m", "job", "--", "echo", "second")
	var out strings.Builder
	second.Stdout = &out
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	first.stdin.Close()
	if err := second.Wait(); err != nil || out.String() != "second\n" {
		t.Fatalf("waiting run: %v, %q", err, out.String())
	}
	first.wait(t)
}

func TestRunExitStatus(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	for script, want := range map[string]int{"exit 0": 0, "exit 3": 3, "kill -KILL $$": 128 + 9} {
		if _, _, code := c.run("run", "status", "--", "sh", "-c", script); code != want {
			t.Errorf("%s: status %d, want %d", script, code, want)
		}
	}
	if _, errOut, code := c.run("run", "status", "--", "/nonexistent/cmd"); code != 127 || !strings.Contains(errOut, "nonexistent") { // as shells
		t.Errorf("missing CMD: %d %q", code, errOut)
	}
}

func TestRunForwardsSignals(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	h := c.hold([]string{"run", "sig"}, `trap 'echo got-term; exit 42' TERM; echo ready; while :; do sleep 0.05; done`)
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	if code := h.wait(t); code != 42 {
		t.Fatalf("status %d, want CMD's 42 after it handled the forwarded SIGTERM", code)
	}
	// The lock was released on exit.
	if _, _, code := c.run("run", "sig", "--", "true"); code != 0 {
		t.Fatalf("lock still held after the run exited: %d", code)
	}
}

func TestRunLockLostKillsCommand(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	c := cli{t: t, dsn: db.DSN}
	h := c.hold([]string{"run", "--kill-after", "5s", "lossy"}, `trap 'echo got-term; exit 0' TERM; echo ready; while :; do sleep 0.05; done`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// This database's only: parallel tests run "pglocks run" in their own.
	if n, err := db.TerminateApplication(ctx, "pglocks run"); err != nil || n == 0 {
		t.Fatalf("terminate the holder's session: %d, %v", n, err)
	}
	if code := h.wait(t); code != 76 {
		t.Fatalf("status %d after the lock was lost, want 76", code)
	}
}

func TestStatus(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	if _, _, code := c.run("migrate"); code != 0 {
		t.Fatal("migrate failed")
	}
	lock := c.hold([]string{"run", "report:monthly"}, waitForStdin)
	ls := c.hold([]string{"run", "--lease", "invoice:7"}, waitForStdin)
	out, errOut, code := c.run("status", "--json")
	if code != 0 {
		t.Fatalf("status: %d %s", code, errOut)
	}
	var st struct {
		Advisory []struct {
			Key, Name string
			PID       uint32
			Granted   bool
		}
		Leases []struct {
			Name  string
			Held  bool
			Token int64
		}
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	key := strconv.FormatInt(pglocks.KeyOf("report:monthly").Int64(), 10)
	if len(st.Advisory) != 1 || st.Advisory[0].Key != key || !st.Advisory[0].Granted || st.Advisory[0].PID == 0 {
		t.Errorf("advisory locks %+v, want report:monthly (%s) held", st.Advisory, key)
	}
	if len(st.Leases) != 1 || st.Leases[0].Name != "invoice:7" || !st.Leases[0].Held || st.Leases[0].Token != 1 {
		t.Errorf("leases %+v, want invoice:7 held with token 1", st.Leases)
	}
	text, _, _ := c.run("status", "report:monthly")
	if !strings.Contains(text, key) || !strings.Contains(text, "pglocks run") || strings.Contains(text, "invoice:7") {
		t.Errorf("status report:monthly:\n%s", text)
	}
	all, _, _ := c.run("status")
	for line := range strings.Lines(text + all) {
		if strings.HasSuffix(strings.TrimSuffix(line, "\n"), " ") {
			t.Errorf("status line ends in spaces: %q", line)
		}
	}
	lock.stdin.Close()
	ls.stdin.Close()
	lock.wait(t)
	ls.wait(t)
}

func TestKilledRunStopsCommand(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	h := c.hold([]string{"run", "orphan"}, `trap 'echo got-term >&2; exit 0' TERM; echo ready; read line`)
	_ = h.cmd.Process.Kill() // pglocks dies without forwarding anything
	// CMD's stdout is the pipe we read: it closes once CMD has exited too.
	select {
	case <-h.errc:
	case <-time.After(time.Minute):
		t.Fatal("pglocks did not die")
	}
	if _, _, code := c.run("run", "--wait", "30s", "orphan", "--", "true"); code != 0 {
		t.Fatalf("the lock of a killed run was not freed: %d", code)
	}
}

func TestBreak(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	c.run("migrate")
	h := c.hold([]string{"run", "--lease", "--ttl", "1h", "stuck"}, `trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done`)
	out, errOut, code := c.run("break", "stuck")
	if code != 0 || !strings.Contains(out, "token is now 2") {
		t.Fatalf("break: %d %q %q", code, out, errOut)
	}
	// The holder's keep-alive finds the lease gone: CMD is stopped.
	if code := h.wait(t); code != 76 {
		t.Fatalf("holder of a broken lease: status %d, want 76", code)
	}
}

func TestKey(t *testing.T) {
	t.Parallel()
	c := cli{t: t}
	out, _, code := c.run("key", "report:monthly")
	if code != 0 || strings.TrimSpace(out) != strconv.FormatInt(pglocks.KeyOf("report:monthly").Int64(), 10) {
		t.Fatalf("key: %d %q", code, out)
	}
	out, _, _ = c.run("key", "--sql", "it's")
	if strings.TrimSpace(out) != "hashtextextended('it''s', 0)" {
		t.Fatalf("key --sql: %q", out)
	}
	if _, errOut, code := c.run("key", ""); code != 64 || !strings.Contains(errOut, "empty name") {
		t.Fatalf("empty name: %d %q", code, errOut)
	}
}

func TestUsageAndConnectionErrors(t *testing.T) {
	t.Parallel()
	c := cli{t: t, dsn: "postgres://nobody@127.0.0.1:1/none?connect_timeout=5"}
	for _, args := range [][]string{{}, {"frobnicate"}, {"run", "x"}, {"run", "x", "true"}, {"run", "--wait", "-1s", "x", "--", "true"}, {"key"}} {
		if _, _, code := c.run(args...); code != 64 {
			t.Errorf("pglocks %q: status %d, want 64", args, code)
		}
	}
	_, errOut, code := c.run("status")
	if code != 69 || !strings.Contains(errOut, "127.0.0.1:1") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("unreachable server: status %d, stderr %q; want 69 and one line naming the address", code, errOut)
	}
}
