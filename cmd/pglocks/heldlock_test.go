//go:build linux

package main_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// extraProcs is how many more processes the jobs of
// TestRunKilledKeepsLockUntilJobDead start: they lengthen the supervisor's
// walk of /proc, during which, before the fix, the server had already
// freed the lock of a SIGKILLed pglocks.
const extraProcs = 100

// After a kill -9 of pglocks holding an advisory lock, another session
// waiting for the lock gets it only once no process of the job is left:
// the supervisor holds a copy of the lock session's socket, so the server
// sees the session end when the supervisor exits, after the job. The job's
// worker (setsid, ignoring SIGTERM, writing the time every ~100µs) must
// have written nothing later than the moment the waiter got the lock.
// Before, the server freed the lock ~1 ms after the kill, while the
// supervisor still walked /proc: worker lines came up to 37 ms after
// another session had the lock.
func TestRunKilledKeepsLockUntilJobDead(t *testing.T) {
	t.Parallel()
	e := newJobEnv(t, nil)
	var margins, deaths []time.Duration
	for i := range runTrials(t) {
		name := fmt.Sprintf("kept-%d", i)
		s := newStamped(t)
		h := e.c.holdArgv([]string{"run", name}, s.argv(t, true, extraProcs)...)
		w := s.started(t)
		waiter := waitForLock(t, e.db, name)
		if err := h.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		got := waiter.granted(t, time.Minute)
		last := s.finalStamp(t, w, killedBound, "the kill -9 of pglocks")
		if last.After(got) {
			t.Fatalf("trial %d: the job's worker wrote at %v after another session got the lock (%v after the kill)",
				i, last.Sub(got), got.Sub(killed))
		}
		margins, deaths = append(margins, got.Sub(last)), append(deaths, w.diedAt().Sub(killed))
		h.wait(t)
	}
	t.Logf("%d trials, %d processes in each job: the worker's last stamp came before the waiter got the lock by min %v, median %v; "+
		"the worker died after the kill: max %v, median %v", len(margins), extraProcs+3,
		slices.Min(margins), median(margins), slices.Max(deaths), median(deaths))
}

// CMD inherits neither the control socket nor the lock session's socket:
// none of its open files is a socket.
func TestRunCommandInheritsNoSocket(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	out, errOut, code := c.run("run", "fds", "--", "sh", "-c", `for f in /proc/$$/fd/*; do readlink "$f"; done; exit 0`)
	if code != 0 || !strings.Contains(out, "pipe:") {
		t.Fatalf("status %d, stdout %q, stderr %q: want 0 and CMD's open files", code, out, errOut)
	}
	if strings.Contains(out, "socket:") {
		t.Fatalf("CMD has a socket open:\n%s", out)
	}
}
