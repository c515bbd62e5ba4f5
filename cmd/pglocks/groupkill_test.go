//go:build linux

package main_test

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A SIGKILL of pglocks' whole process group (kill -9 -PGID, or timeout -k
// after its grace) kills pglocks, not the job: the supervisor, in a group
// of its own, SIGKILLs every process of the job at once, a setsid worker
// that ignores SIGTERM too. Before, the supervisor was in pglocks' group
// and died with it, CMD died of its parent-death signal, and the worker
// ran on without the lock.
func TestRunGroupKilled(t *testing.T) {
	t.Parallel()
	t.Run("KillGroup", func(t *testing.T) {
		t.Parallel()
		e := newJobEnv(t, nil)
		s := newStamped(t)
		cmd := e.c.command(append([]string{"run", "grouped", "--"}, s.argv(t, true, 0)...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // as setsid(1): a session and group of its own
		h := e.c.holdCmd(cmd)
		w := s.started(t)
		if err := unix.Kill(-h.cmd.Process.Pid, unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		h.wait(t)
		s.finalStamp(t, w, killedBound, "kill -9 of pglocks' process group")
		t.Logf("the worker died %v after the kill", w.diedAt().Sub(killed))
		if _, errOut, code := e.c.run("run", "--wait", "30s", "grouped", "--", "true"); code != 0 {
			t.Fatalf("the lock was not freed: %d %s", code, errOut)
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		t.Parallel()
		if _, err := exec.LookPath("timeout"); err != nil {
			t.Skip("no timeout(1)")
		}
		e := newJobEnv(t, nil)
		s := newStamped(t)
		// timeout(1) runs pglocks in a process group of its own; at 2s it
		// sends SIGTERM to the group, at 3s SIGKILL.
		args := append([]string{"-k", "1", "2", binary, "run", "timed", "--"}, s.argv(t, true, 0)...)
		cmd := exec.Command("timeout", args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+e.c.dsn)
		h := e.c.holdCmd(cmd)
		w := s.started(t)
		code := h.wait(t)
		s.finalStamp(t, w, killedBound, fmt.Sprintf("timeout -k 1 2 exited (status %d)", code))
	})
}
