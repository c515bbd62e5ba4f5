package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// supervisorName is argv[0] of pglocks' supervisor (see supervised), by
// which main tells that internal mode apart: it is no subcommand.
const supervisorName = "pglocks-supervisor"

// ctlStop, on the control pipe, says the lock is lost: stop the whole
// job. Any other byte is a signal to forward to CMD's process group.
const ctlStop = 0

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

// supervisor runs CMD for pglocks: KILLAFTER -- CMD [ARGS...], the
// control pipe on fd 3.
type supervisor struct {
	pid       int // CMD's, and its process group's id
	killAfter time.Duration
	tty       terminal
	exits     <-chan unix.WaitStatus // CMD's changes; closed when no child is left
	status    int                    // CMD's exit status, 128+N for signal N
	cmdDone   bool
	suspended bool // CMD stopped (Ctrl-Z) and pglocks' group with it
	stopping  bool // the whole job was sent SIGTERM
	warned    bool // that /proc could not be read
	kill      <-chan time.Time
	rescan    <-chan time.Time
}

func supervise(args []string) int {
	if len(args) < 3 || args[1] != "--" {
		return internalUse("arguments")
	}
	killAfter, err := time.ParseDuration(args[0])
	var st unix.Stat_t
	if err != nil || unix.Fstat(3, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return internalUse("arguments or control pipe")
	}
	// CMD gets stdin, stdout and stderr only; ps and top show our name,
	// not "exe".
	unix.CloseOnExec(3)
	_ = os.WriteFile("/proc/self/comm", []byte(supervisorName), 0)
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "pglocks: start %s: become a subreaper: %v\n", args[2], err)
		return exitUsage
	}
	// Signals sent to pglocks' process group reach pglocks, which
	// forwards them: the supervisor's own copies are dropped. Caught, not
	// ignored: CMD gets the default dispositions.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGINT, syscall.SIGCONT)
	s := &supervisor{killAfter: killAfter, tty: terminalOf()}
	if err := s.start(args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "pglocks: "+oneLine(err.Error()))
		return exitUsage
	}
	return s.loop(readControl(os.NewFile(3, "control")), sigs)
}

func internalUse(what string) int {
	fmt.Fprintf(os.Stderr, "pglocks: %s is internal to pglocks run (bad %s)\n", supervisorName, what)
	return exitUsage
}

// start starts CMD in a process group of its own, in the terminal's
// foreground if pglocks' group had it.
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
	s.exits = reap(s.pid, s.tty.fg)
	return nil
}

// loop runs until no process of the job is left, and returns CMD's status.
func (s *supervisor) loop(ctl <-chan byte, sigs <-chan os.Signal) int {
	for {
		select {
		case b, ok := <-ctl:
			switch {
			case !ok: // pglocks is gone, and its lock with it
				ctl = nil
				s.tty.reclaim(s.pid)
				s.killAll()
			case b == ctlStop:
				s.stop()
			case !s.cmdDone:
				_ = unix.Kill(-s.pid, syscall.Signal(b))
			}
		case ws, ok := <-s.exits:
			if !ok {
				return s.status
			}
			s.cmdChanged(ws)
		case sig := <-sigs:
			if sig == syscall.SIGCONT {
				s.resume()
			}
		case <-s.kill:
			s.killAll()
		case <-s.rescan:
			s.signalJob(unix.SIGKILL)
		}
	}
}

// cmdChanged handles CMD's stop or exit.
func (s *supervisor) cmdChanged(ws unix.WaitStatus) {
	switch {
	case ws.Stopped():
		s.cmdStopped()
		return
	case ws.Exited():
		s.status = ws.ExitStatus()
	case ws.Signaled():
		s.status = 128 + int(ws.Signal())
	default:
		return
	}
	s.cmdDone = true
	s.tty.reclaim(s.pid)
	s.stop() // what CMD left running: the lock is released once it is gone
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
	if err := signalTree(sigs...); err != nil && !s.warned {
		s.warned = true
		fmt.Fprintf(os.Stderr, "pglocks: %v; signalled CMD's process group only\n", err)
	}
}

// readControl reads pglocks' instructions; the channel is closed when
// pglocks is gone.
func readControl(f *os.File) <-chan byte {
	ch := make(chan byte, 8)
	go func() {
		defer close(ch)
		b := make([]byte, 1)
		for {
			n, err := f.Read(b)
			if n == 1 {
				ch <- b[0]
			}
			if err != nil && !errors.Is(err, syscall.EINTR) {
				return
			}
		}
	}()
	return ch
}

// reap reaps every child of the supervisor (CMD, and the job's processes
// reparented to it), sends CMD's changes (stops too, if stops), and
// closes the channel when no child is left.
func reap(pid int, stops bool) <-chan unix.WaitStatus {
	ch := make(chan unix.WaitStatus, 4)
	flags := 0
	if stops {
		flags = unix.WUNTRACED
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
				if !ws.Stopped() {
					pid = -1 // reaped: its pid may be reused
				}
			}
		}
	}()
	return ch
}
