package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// supervised is a job run by pglocks' supervisor (see supervise): a child
// of pglocks running this same binary, which runs CMD in a process group
// of its own and is the subreaper of every process CMD starts.
//
// Why a child process, and not pglocks itself: when pglocks is SIGKILLed,
// something must still be there to kill the job, and its lock is gone.
// The supervisor learns of pglocks' death from the control pipe, whose
// only writer is pglocks: its read returns EOF however pglocks ends
// (SIGKILL, crash, OOM killer), at once. A parent-death signal (Pdeathsig)
// would do less: it fires when the thread that forked exits, not the
// process, and it is one signal where pglocks also has to say "the lock
// is lost" and "forward SIGTERM", in order; the pipe carries those too.
//
// Why a subreaper: a process of the job that leaves CMD's group (setsid)
// and whose parent exits (a double fork) is reparented to the supervisor
// instead of init, so it is still the supervisor's descendant, found by
// walking /proc and signalled with the rest; and "no child left" is
// exactly "no process of the job left".
type supervised struct {
	cmd    *exec.Cmd
	ctl    *os.File // the control pipe: one byte per instruction
	exited chan struct{}
	werr   error
}

// startJob starts pglocks' supervisor, which starts CMD.
func startJob(argv []string, killAfter time.Duration, stderr io.Writer) (job, error) {
	// Should the supervisor die alone (killed by someone), the job's
	// processes are reparented to pglocks, which kills them (wait below).
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, fail(exitUsage, "start %s: become a subreaper: %v", argv[0], err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fail(exitUsage, "start %s: control pipe: %v", argv[0], err)
	}
	// /proc/self/exe: this very binary, even if its file was replaced.
	cmd := exec.Command("/proc/self/exe", append([]string{killAfter.String(), "--"}, argv...)...)
	cmd.Args[0] = supervisorName
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{r} // fd 3
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		return nil, fail(exitUsage, "start %s: start the supervisor: %v", argv[0], err)
	}
	// CMD may have the terminal now: pglocks writes to it from the
	// background (its messages), which must not stop it (stty tostop).
	signal.Ignore(syscall.SIGTTOU)
	s := &supervised{cmd: cmd, ctl: w, exited: make(chan struct{})}
	go s.wait(argv[0], stderr)
	return s, nil
}

// wait waits for the supervisor; should it have been killed, it kills
// what is left of the job, reparented to pglocks, before done is closed.
func (s *supervised) wait(name string, stderr io.Writer) {
	s.werr = s.cmd.Wait()
	if ws, ok := s.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		fmt.Fprintf(stderr, "pglocks: the supervisor of %s died (%v); killing what is left of the job\n", name, ws.Signal())
	}
	killAll() // nothing is left when the supervisor exited on its own
	s.ctl.Close()
	close(s.exited)
}

func (s *supervised) forward(sig os.Signal) {
	if n, ok := sig.(syscall.Signal); ok && n > 0 && n < 256 {
		_, _ = s.ctl.Write([]byte{byte(n)})
	}
}

func (s *supervised) stop() { _, _ = s.ctl.Write([]byte{ctlStop}) }

func (s *supervised) done() <-chan struct{} { return s.exited }

// err is the supervisor's exit, whose status is CMD's.
func (s *supervised) err() error { return s.werr }
