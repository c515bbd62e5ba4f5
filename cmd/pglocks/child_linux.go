package main

import (
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// supervised is a job run by pglocks' supervisor (see supervise): a child
// of pglocks running this same binary, in a process group of its own,
// which runs CMD in another and is the subreaper of every process CMD
// starts.
//
// Why a child process, and not pglocks itself: when pglocks is SIGKILLed,
// something must still be there to kill the job, and its lock is gone.
// The supervisor learns of pglocks' death from the control socket, whose
// other end only pglocks holds: its read returns EOF however pglocks ends
// (SIGKILL, crash, OOM killer), at once. A parent-death signal would do
// less: it fires when the thread that forked exits, not the process, and
// it is one signal where pglocks also has to say "the lock is lost",
// "forward SIGTERM" and "I trust the lock until then", in order.
//
// Why a process group of its own: a SIGKILL of pglocks' whole group
// (kill -9 -PGID; timeout -k after its grace) must not take the supervisor
// with it.
//
// Why a subreaper: a process of the job that leaves CMD's group (setsid)
// and whose parent exits (a double fork) is reparented to the supervisor
// instead of init, so it is still the supervisor's descendant, found by
// walking /proc and signalled with the rest; and "no child left" is
// exactly "no process of the job left".
//
// With an advisory lock the supervisor also holds a duplicate of the lock
// session's socket, which it never uses: should pglocks be SIGKILLed, the
// server sees the session end, and frees the lock, only once the
// supervisor has exited, after the last process of the job.
type supervised struct {
	cmd      *exec.Cmd
	name     string   // CMD's
	ctl      *os.File // pglocks' end of the control socket
	read     chan struct{}
	expiredc chan struct{} // closed on reportExpired
	exited   chan struct{}
	werr     error
}

// startJob starts pglocks' supervisor, which starts CMD. It closes
// spec.session.
func startJob(spec jobSpec) (job, error) {
	name := spec.argv[0]
	if spec.session != nil {
		defer spec.session.Close()
	}
	// Should the supervisor die alone (killed by someone), the job's
	// processes are reparented to pglocks, which kills them (wait below).
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, fail(exitUsage, "start %s: become a subreaper: %v", name, err)
	}
	ours, theirs, err := socketPair()
	if err != nil {
		return nil, fail(exitUsage, "start %s: control socket: %v", name, err)
	}
	files, session := []*os.File{theirs}, "-" // fd 3
	if spec.session != nil {
		files, session = append(files, spec.session), "4"
	}
	var trust int64
	if !spec.trusted.IsZero() {
		trust = monoOf(spec.trusted)
	}
	args := append([]string{spec.killAfter.String(), strconv.Itoa(unix.Getpgrp()),
		strconv.FormatInt(trust, 10), session, "--"}, spec.argv...)
	cmd, err := startSupervisor(args, files)
	theirs.Close()
	if err != nil {
		ours.Close()
		return nil, fail(exitUsage, "start %s: start the supervisor: %v", name, err)
	}
	// CMD may have the terminal now: pglocks writes to it from the
	// background (its messages), which must not stop it (stty tostop).
	signal.Ignore(syscall.SIGTTOU)
	s := &supervised{cmd: cmd, name: name, ctl: ours, read: make(chan struct{}),
		expiredc: make(chan struct{}), exited: make(chan struct{})}
	go s.reports()
	go s.wait()
	return s, nil
}

// startSupervisor starts this binary as the supervisor: /proc/self/exe
// (this very binary, even if its file was replaced), or, without /proc,
// the path it was started by.
func startSupervisor(args []string, files []*os.File) (*exec.Cmd, error) {
	paths := []string{"/proc/self/exe"}
	if p, err := os.Executable(); err == nil {
		paths = append(paths, p)
	}
	if p, err := exec.LookPath(os.Args[0]); err == nil {
		paths = append(paths, p)
	}
	var errs []error
	for _, path := range paths {
		cmd := exec.Command(path, args...)
		cmd.Args[0] = supervisorName
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		cmd.ExtraFiles = files
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			errs = append(errs, err)
			continue
		}
		return cmd, nil
	}
	return nil, errors.Join(errs...)
}

// reports reads the supervisor's reports until it is gone.
func (s *supervised) reports() {
	defer close(s.read)
	b := make([]byte, 1)
	closed := false
	for {
		if _, err := s.ctl.Read(b); err != nil {
			return
		}
		if b[0] == reportExpired && !closed {
			closed = true
			close(s.expiredc)
		}
	}
}

// wait waits for the supervisor; should it have been killed, it kills
// what is left of the job, reparented to pglocks, before done is closed.
func (s *supervised) wait() {
	err := s.cmd.Wait()
	killAll() // nothing is left when the supervisor exited on its own
	if ws, ok := s.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		err = fail(exitSoftware, "the supervisor of %s was killed (%v): %s's own status is unknown; "+
			"every process left of the job was SIGKILLed", s.name, ws.Signal(), s.name)
	}
	s.werr = err
	// Its reports are all in the socket: read them to the end (EOF, as
	// the supervisor's end is closed; the deadline is for safety).
	_ = s.ctl.SetReadDeadline(time.Now().Add(time.Second))
	<-s.read
	s.ctl.Close()
	close(s.exited)
}

func (s *supervised) send(m ctlMsg) {
	// A stopped supervisor must not block pglocks once the socket's
	// buffer is full: such an instruction is dropped.
	_ = s.ctl.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = s.ctl.Write(m.encode())
}

func (s *supervised) forward(sig os.Signal) {
	n, ok := sig.(syscall.Signal)
	switch {
	case !ok:
	case n == syscall.SIGCONT:
		s.send(ctlMsg{op: ctlContinue})
	default:
		s.send(ctlMsg{op: ctlSignal, arg: int64(n)})
	}
}

func (s *supervised) stop() { s.send(ctlMsg{op: ctlStop}) }

func (s *supervised) trust(until time.Time) { s.send(ctlMsg{op: ctlTrust, arg: monoOf(until)}) }

func (s *supervised) expired() <-chan struct{} { return s.expiredc }

func (s *supervised) done() <-chan struct{} { return s.exited }

// err is the supervisor's exit, whose status is CMD's.
func (s *supervised) err() error { return s.werr }

// contSignals are the signals pglocks passes on besides those it forwards:
// SIGCONT (fg, bg) continues CMD, should it be stopped.
var contSignals = []os.Signal{syscall.SIGCONT}
