package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// supervisorName is argv[0] of pglocks' supervisor (see supervised), by
// which main tells that internal mode apart: it is no subcommand.
const supervisorName = "pglocks-supervisor"

// rescanEvery is how often a job being SIGKILLed is walked again, for a
// process forked while the last walk ran.
const rescanEvery = 50 * time.Millisecond

func init() {
	// CMD's parent-death signal fires when the thread that started it
	// exits; keep main, which starts it, on the main thread, which lives
	// as long as the process.
	runtime.LockOSThread()
}

// superviseIfAsked runs the supervisor and returns its exit status when
// this process is pglocks' supervisor.
func superviseIfAsked() (int, bool) {
	if os.Args[0] != supervisorName {
		return 0, false
	}
	return supervise(os.Args[1:]), true
}

// supervisor runs CMD for pglocks. Its arguments are KILLAFTER PGRP TRUST
// SESSION -- CMD [ARGS...]: --kill-after, pglocks' process group, the
// lock's trust deadline on monoNow's clock (0: none), and "4" if fd 4 is
// the lock session's socket ("-" if none); the control socket is fd 3.
type supervisor struct {
	name      string // CMD's
	pid       int    // CMD's, and its process group's id
	killAfter time.Duration
	tty       terminal
	ctl       *os.File               // the control socket, for reports
	exits     <-chan unix.WaitStatus // CMD's changes; closed when no child is left
	status    int                    // CMD's exit status, 128+N for signal N
	cmdDone   bool
	stopped   bool // CMD is stopped, as last seen
	stopping  bool // the whole job was sent SIGTERM
	gone      bool // pglocks is gone
	warned    bool // that /proc could not be read
	warnedTTY bool // that CMD stopped on the terminal with no shell to continue it
	trust     int64
	expiry    *time.Timer // runs at trust
	expired   bool        // trust passed before pglocks extended it
	kill      <-chan time.Time
	rescan    <-chan time.Time
}

func supervise(args []string) int {
	if len(args) < 6 || args[4] != "--" {
		return internalUse("arguments")
	}
	killAfter, err1 := time.ParseDuration(args[0])
	pgrp, err2 := strconv.Atoi(args[1])
	trust, err3 := strconv.ParseInt(args[2], 10, 64)
	var st unix.Stat_t
	if errors.Join(err1, err2, err3) != nil || unix.Fstat(3, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return internalUse("arguments or control socket")
	}
	// CMD gets stdin, stdout and stderr only.
	unix.CloseOnExec(3)
	if args[3] == "4" {
		unix.CloseOnExec(4) // held open, never used: see supervised
	}
	// ps and top show our name, not "exe".
	_ = os.WriteFile("/proc/self/comm", []byte(supervisorName), 0)
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "pglocks: start %s: become a subreaper: %v\n", args[5], err)
		return exitUsage
	}
	ctl := os.NewFile(3, "control")
	s := &supervisor{name: args[5], killAfter: killAfter, tty: terminalOf(pgrp), ctl: ctl, expiry: time.NewTimer(time.Hour)}
	s.expiry.Stop()
	s.setTrust(trust)
	if err := s.start(args[5:]); err != nil {
		var ee *exitError
		errors.As(startError(args[5], err), &ee) // 127, 126 as shells say
		fmt.Fprintln(os.Stderr, "pglocks: "+oneLine(ee.msg))
		return ee.code
	}
	return s.loop(readControl(ctl))
}

func internalUse(what string) int {
	fmt.Fprintf(os.Stderr, "pglocks: %s is internal to pglocks run (bad %s)\n", supervisorName, what)
	return exitUsage
}

// start starts CMD in a process group of its own, in the terminal's
// foreground if pglocks' group has it. Signals that pglocks' parent
// ignored (nohup) are ignored by CMD too: the supervisor leaves every
// disposition as it inherited it.
func (s *supervisor) start(argv []string) error {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:    true,
		Foreground: s.tty.fg,
		Ctty:       0,
		// Should the supervisor itself be killed, CMD dies; its
		// descendants are reparented to pglocks, which kills them.
		Pdeathsig: syscall.SIGKILL,
	}
	err := cmd.Start()
	// Taking the terminal back from the background must not stop us.
	signal.Ignore(syscall.SIGTTOU)
	if err != nil {
		s.tty.reclaim(0) // from the group of a child that failed to exec
		return fmt.Errorf("start %s: %w", argv[0], err)
	}
	s.pid = cmd.Process.Pid
	s.exits = reap(s.pid, s.tty.ok)
	return nil
}

// loop runs until no process of the job is left, and returns CMD's status.
func (s *supervisor) loop(ctl <-chan ctlMsg) int {
	for {
		select {
		case m, ok := <-ctl:
			if !ok {
				ctl = nil
				s.pglocksGone()
				continue
			}
			s.instruction(m)
		case ws, ok := <-s.exits:
			if !ok {
				s.finish()
				return s.status
			}
			s.cmdChanged(ws)
		case <-s.expiry.C:
			s.trustExpired()
		case <-s.kill:
			s.killAll()
		case <-s.rescan:
			s.signalJob(unix.SIGKILL)
		}
	}
}

func (s *supervisor) instruction(m ctlMsg) {
	switch m.op {
	case ctlStop:
		s.stop()
	case ctlSignal:
		// And SIGCONT: a stopped CMD acts on the signal now, not once
		// someone continues it.
		if !s.cmdDone {
			_ = unix.Kill(-s.pid, syscall.Signal(m.arg))
			_ = unix.Kill(-s.pid, unix.SIGCONT)
		}
	case ctlContinue:
		s.resume()
	case ctlTrust:
		s.setTrust(m.arg)
	}
}

// pglocksGone: the control socket's EOF. pglocks is gone and, but for the
// session socket the supervisor holds, its lock with it: every process of
// the job is SIGKILLed at once, CMD's group first.
func (s *supervisor) pglocksGone() {
	s.gone = true
	s.killAll()
	s.expiry.Stop()
	s.tty.reclaim(s.pid)
}

// cmdChanged handles CMD's stop, continuation or exit.
func (s *supervisor) cmdChanged(ws unix.WaitStatus) {
	switch {
	case ws.Stopped():
		s.stopped = true
		s.cmdStopped(ws.StopSignal())
		return
	case ws.Continued():
		s.stopped = false
		return
	case ws.Exited():
		s.status = ws.ExitStatus()
	case ws.Signaled():
		s.status = 128 + int(ws.Signal())
	default:
		return
	}
	s.cmdDone, s.stopped = true, false
	s.tty.reclaim(s.pid)
	s.stop() // what CMD left running: the lock is released once it is gone
}

// setTrust extends the trust deadline to t (on monoNow's clock), if later.
func (s *supervisor) setTrust(t int64) {
	if t <= s.trust || s.gone {
		return
	}
	s.trust = t
	s.expiry.Reset(time.Duration(t - monoNow()))
}

// trustExpired is the dead-man's switch: pglocks did not extend its trust
// deadline in time (it is stopped, or hung), so its lock may be free by
// now; the job is stopped as on a loss, and pglocks told (it exits 76).
func (s *supervisor) trustExpired() {
	if d := time.Duration(s.trust - monoNow()); d > 0 {
		s.expiry.Reset(d)
		return
	}
	if s.expired || s.gone {
		return
	}
	s.expired = true
	s.report(reportExpired)
	if !s.stopping {
		fmt.Fprintf(os.Stderr, "pglocks: the lock held for %s was not confirmed by its deadline (pglocks stopped or hung?); "+
			"sending SIGTERM to the job\n", s.name)
	}
	s.stop()
}

// finish: no process of the job is left. Should the trust deadline have
// passed before (the timer not yet run), pglocks is told.
func (s *supervisor) finish() {
	if !s.expired && !s.gone && s.trust != 0 && monoNow() >= s.trust {
		s.expired = true
		s.report(reportExpired)
	}
}

// report sends pglocks a report; a stopped pglocks reads it once
// continued.
func (s *supervisor) report(b byte) {
	_ = s.ctl.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = s.ctl.Write([]byte{b})
}

// stop sends SIGTERM to every process of the job (and SIGCONT, should one
// be stopped), and arms SIGKILL at --kill-after.
func (s *supervisor) stop() {
	if s.stopping {
		return
	}
	s.stopping = true
	s.signalJob(unix.SIGTERM, unix.SIGCONT)
	s.kill = time.After(s.killAfter)
}

// killAll SIGKILLs every process of the job, and again every rescanEvery
// until none is left.
func (s *supervisor) killAll() {
	s.kill = nil
	s.signalJob(unix.SIGKILL)
	if s.rescan == nil {
		s.rescan = time.NewTicker(rescanEvery).C
	}
}

// signalJob signals CMD's process group, at once (no member forks past
// it), then every process below the supervisor, CMD's group or not.
func (s *supervisor) signalJob(sigs ...unix.Signal) {
	if !s.cmdDone { // once CMD is reaped its pid, the group's id, may be reused
		for _, sig := range sigs {
			_ = unix.Kill(-s.pid, sig)
		}
	}
	if err := signalTree(sigs...); err != nil && !s.warned && hasChildren() {
		s.warned = true
		fmt.Fprintf(os.Stderr, "pglocks: %v; signalled CMD's process group only\n", err)
	}
}

// reap reaps every child of the supervisor (CMD, and the job's processes
// reparented to it), sends CMD's changes (stops and continuations too, if
// stops), and closes the channel when no child is left.
func reap(pid int, stops bool) <-chan unix.WaitStatus {
	ch := make(chan unix.WaitStatus, 4)
	flags := 0
	if stops {
		flags = unix.WUNTRACED | unix.WCONTINUED
	}
	go func() {
		defer close(ch)
		for {
			var ws unix.WaitStatus
			got, err := unix.Wait4(-1, &ws, flags, nil)
			switch {
			case errors.Is(err, unix.EINTR):
				continue
			case err != nil: // ECHILD: no process of the job is left
				return
			case got == pid:
				ch <- ws
				if ws.Exited() || ws.Signaled() {
					pid = -1 // reaped: its pid may be reused
				}
			}
		}
	}()
	return ch
}

// hasChildren reports whether the supervisor has a child left, without
// reaping it.
func hasChildren() bool {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WSTOPPED|unix.WCONTINUED|unix.WNOHANG|unix.WNOWAIT, nil)
	return !errors.Is(err, unix.ECHILD)
}
