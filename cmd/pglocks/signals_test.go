//go:build linux

package main_test

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// waitWithin returns the holder's exit status, failing the test if it has
// not exited within d.
func (h *holder) waitWithin(t *testing.T, d time.Duration, what string) int {
	t.Helper()
	select {
	case <-h.errc:
		return h.cmd.ProcessState.ExitCode()
	case <-time.After(d):
		t.Fatalf("pglocks run did not exit within %v after %s", d, what)
		return -1
	}
}

// A signal forwarded to CMD's group reaches it even if it is stopped:
// pglocks sends SIGCONT after it. Before, a stopped CMD kept the SIGTERM
// pending, and pglocks waited for ever, holding the lock.
func TestRunForwardsToStoppedCommand(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	pidFile := t.TempDir() + "/pid"
	h := c.holdArgv([]string{"run", "stopped-cmd"}, "sh", "-c", `echo $$ >"$1"; echo ready; exec sleep 600`, "job", pidFile)
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(-pid, unix.SIGSTOP); err != nil { // CMD's group, as kill -STOP -PGID
		t.Fatal(err)
	}
	waitState(t, pid, "T")
	if err := h.cmd.Process.Signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := h.waitWithin(t, 30*time.Second, "SIGTERM"); code != 128+15 {
		t.Fatalf("status %d, want 143 (CMD killed by the forwarded SIGTERM)", code)
	}
}

// waitState waits until process pid is in state (a letter of ps' STAT).
func waitState(t *testing.T, pid int, state string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		if s, ok := parseState(b); ok && s == state {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d is not in state %s after 30s", pid, state)
		}
		tick := time.NewTimer(5 * time.Millisecond)
		<-tick.C
	}
}

// Under nohup (SIGHUP ignored when pglocks starts), SIGHUP stays ignored
// down to CMD and is not forwarded. Before, pglocks caught it and
// forwarded it, and CMD (which the supervisor started with the default
// disposition) died of it.
func TestRunKeepsIgnoredSignals(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	maskFile := t.TempDir() + "/sigign"
	script := `trap 'exit 7' TERM
sed -n 's/^SigIgn:[[:space:]]*//p' /proc/$$/status >"$1"
echo ready
while :; do sleep 0.05; done`
	cmd := exec.Command("sh", "-c", `trap '' HUP; exec "$0" "$@"`, binary, "run", "nohup", "--", "sh", "-c", script, "job", maskFile)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+c.dsn)
	h := c.holdCmd(cmd)
	b, err := os.ReadFile(maskFile)
	if err != nil {
		t.Fatal(err)
	}
	mask, err := strconv.ParseUint(strings.TrimSpace(string(b)), 16, 64)
	if err != nil {
		t.Fatalf("CMD's SigIgn %q: %v", b, err)
	}
	if mask&(1<<(unix.SIGHUP-1)) == 0 {
		t.Errorf("CMD's ignored signals %#x: SIGHUP is not ignored", mask)
	}
	// SIGHUP first, then SIGTERM, which CMD handles: had the SIGHUP been
	// forwarded to a CMD that does not ignore it, CMD would die of it
	// (129) first.
	if err := h.cmd.Process.Signal(unix.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Process.Signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := h.waitWithin(t, 30*time.Second, "SIGHUP and SIGTERM"); code != 7 {
		t.Fatalf("status %d, want CMD's 7 (it handled SIGTERM, and SIGHUP stayed ignored)", code)
	}
}

// A lock lost just before CMD exits is still a loss: pglocks exits 76,
// not CMD's 0, though it learns of the loss only after CMD is done (from
// the failed release). Before, it released (failing), and exited 0.
func TestRunLossAsCommandExits(t *testing.T) {
	t.Parallel()
	e := newJobEnv(t, nil)
	for i := range runTrials(t) {
		name := "exiting-" + strconv.Itoa(i)
		h := e.c.hold([]string{"run", name}, waitForStdin)
		e.loseLock(t, name) // returns once the session is gone
		h.stdin.Close()
		if code := h.wait(t); code != 76 {
			t.Fatalf("trial %d: status %d, want 76: the lock was lost before CMD exited", i, code)
		}
	}
}

// Without /proc (a container or a mount namespace without it), the
// supervisor is started from the path pglocks was run by, and CMD runs.
// Before, the re-execution of /proc/self/exe failed and pglocks exited 64.
func TestRunWithoutProc(t *testing.T) {
	t.Parallel()
	if err := exec.Command("unshare", "--mount", "true").Run(); err != nil {
		t.Skipf("cannot make a mount namespace: %v", err)
	}
	c := newCLI(t)
	cmd := exec.Command("unshare", "--mount", "--propagation", "private",
		"sh", "-c", `umount -l /proc && exec "$0" "$@"`, binary, "run", "noproc", "--", "sh", "-c", "echo ran")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+c.dsn)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	_ = cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != 0 || out.String() != "ran\n" {
		t.Fatalf("without /proc: status %d, stdout %q, stderr %q; want 0 and ran", code, out.String(), errOut.String())
	}
}
