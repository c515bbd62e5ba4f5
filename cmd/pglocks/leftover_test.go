//go:build linux

package main_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A worker that ignores SIGTERM is SIGKILLed at --kill-after after the
// loss, and pglocks exits 76 only then.
func TestRunKillAfterEscalates(t *testing.T) {
	t.Parallel()
	e := newJobEnv(t, nil)
	dir := t.TempDir()
	lines, pidFile := filepath.Join(dir, "lines"), filepath.Join(dir, "pid")
	script := `( trap '' TERM; exec </dev/null >/dev/null 2>&1
  while :; do date +%s%N >>"$1"; sleep 0.1; done ) &
echo $! >"$2"
echo ready
wait
`
	h := e.c.holdArgv([]string{"run", "--kill-after", "1s", "stubborn"}, "sh", "-c", script, "job", lines, pidFile)
	w := watchWorker(t, pidFile)
	waitLines(t, lines, 2)
	lost := time.Now()
	e.loseLock(t, "stubborn")
	if code := h.wait(t); code != 76 {
		t.Fatalf("status %d after the lock was lost, want 76", code)
	}
	exited := time.Now()
	if !w.exitedBy(exited) {
		t.Fatal("pglocks exited 76 while the job's worker, which ignores SIGTERM, still ran")
	}
	if d := w.diedAt().Sub(lost); d < time.Second {
		t.Fatalf("the worker, which ignores SIGTERM, died %v after the loss, before --kill-after (1s)", d)
	}
	if n, _ := linesAfter(t, lines, exited); n > 0 {
		t.Fatalf("%d worker lines after pglocks exited", n)
	}
}

// When CMD exits, what it left running is stopped before the lock is
// released: the job never runs unlocked. pglocks exits with CMD's status.
func TestRunStopsLeftoversBeforeRelease(t *testing.T) {
	t.Parallel()
	e := newJobEnv(t, nil)
	dir := t.TempDir()
	lines, pidFile := filepath.Join(dir, "lines"), filepath.Join(dir, "pid")
	script := `( exec </dev/null >/dev/null 2>&1
  while :; do date +%s%N >>"$1"; sleep 0.1; done ) &
echo $! >"$2"
echo ready
read line
exit 3
`
	h := e.c.holdArgv([]string{"run", "leftover"}, "sh", "-c", script, "job", lines, pidFile)
	w := watchWorker(t, pidFile)
	waitLines(t, lines, 2)
	h.stdin.Close()
	if code := h.wait(t); code != 3 {
		t.Fatalf("status %d, want CMD's 3", code)
	}
	exited := time.Now()
	if !w.exitedBy(exited) {
		t.Fatal("pglocks exited (and released the lock) while CMD's worker still ran")
	}
	if n, _ := linesAfter(t, lines, exited); n > 0 {
		t.Fatalf("%d worker lines after pglocks exited", n)
	}
	if _, errOut, code := e.c.run("run", "leftover", "--", "true"); code != 0 {
		t.Fatalf("the lock was not released: %d %s", code, errOut)
	}
}

// Should the supervisor alone be killed, pglocks (a subreaper too) kills
// what is left of the job before it releases the lock, says so, and exits
// 70: CMD's own status is unknown (before, 137 said "CMD was SIGKILLed").
func TestRunSupervisorKilled(t *testing.T) {
	t.Parallel()
	e := newJobEnv(t, nil)
	dir := t.TempDir()
	lines, pidFile := filepath.Join(dir, "lines"), filepath.Join(dir, "pid")
	cmd := e.c.command("run", "orphaned", "--", "sh", "-c", jobScript, "job", lines, pidFile)
	var errOut strings.Builder
	cmd.Stderr = &errOut
	h := e.c.holdCmd(cmd)
	w := watchWorker(t, pidFile)
	waitLines(t, lines, 2)
	sup := childOf(t, h.cmd.Process.Pid)
	if err := unix.Kill(sup, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := h.wait(t); code != 70 || !strings.Contains(errOut.String(), "supervisor") {
		t.Fatalf("status %d after the supervisor was killed, stderr %q; want 70 and a line on the supervisor", code, errOut.String())
	}
	if !w.exitedBy(time.Now()) {
		t.Fatal("pglocks exited (and released the lock) while the job's worker still ran")
	}
	if _, errOut, code := e.c.run("run", "orphaned", "--", "true"); code != 0 {
		t.Fatalf("the lock was not released: %d %s", code, errOut)
	}
}

// childOf returns the pid of process pid's only child.
func childOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) != 1 {
		t.Fatalf("pglocks' children: %q, want one (its supervisor)", f)
	}
	child, err := strconv.Atoi(f[0])
	if err != nil {
		t.Fatal(err)
	}
	return child
}
