//go:build linux

package main_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func init() { helpers["shell"] = jobShell }

// jobShell is a shell with job control reduced to one job, as the tests'
// terminal needs: it leads the terminal's session (its stdin), runs its
// arguments as a job in a process group of their own, in the foreground
// (or in the background, `job &`, with PGLOCKS_TEST_SHELL_BG=1), and when
// the job stops (Ctrl-Z, or reading the terminal from the background) it
// says "stopped" on stdout, takes the terminal back and resumes the job in
// the foreground (fg).
func jobShell() int {
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Foreground: true, Ctty: 0}
	if os.Getenv("PGLOCKS_TEST_SHELL_BG") == "1" {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "shell:", err)
		return 1
	}
	signal.Ignore(syscall.SIGTTOU) // to take the terminal back
	pid := cmd.Process.Pid
	for {
		var ws unix.WaitStatus
		if _, err := unix.Wait4(pid, &ws, unix.WUNTRACED, nil); errors.Is(err, unix.EINTR) {
			continue
		} else if err != nil {
			fmt.Fprintln(os.Stderr, "shell:", err)
			return 1
		}
		switch {
		case ws.Stopped():
			fmt.Println("stopped")
			_ = unix.IoctlSetPointerInt(0, unix.TIOCSPGRP, unix.Getpgrp())
			_ = unix.IoctlSetPointerInt(0, unix.TIOCSPGRP, pid)
			_ = unix.Kill(-pid, unix.SIGCONT)
		case ws.Exited():
			return ws.ExitStatus()
		case ws.Signaled():
			return 128 + int(ws.Signal())
		}
	}
}

// ttyRun is `pglocks run` as a foreground job of jobShell on a terminal
// of its own (a pseudo-terminal): its stdin is the terminal, its stdout
// (and the shell's) a pipe the test reads line by line.
type ttyRun struct {
	shell  *exec.Cmd
	master *os.File
	lines  chan string
	done   chan struct{}
}

func (c cli) onTerminal(t *testing.T, script string) *ttyRun {
	t.Helper()
	return c.onTerminalWith(t, script, ttyOptions{})
}

// ttyOptions say how jobShell runs pglocks: in the background (`&`), on a
// terminal set to stop background writers (stty tostop).
type ttyOptions struct{ background, tostop bool }

func (c cli) onTerminalWith(t *testing.T, script string, o ttyOptions) *ttyRun {
	t.Helper()
	master, slave := openPTY(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if o.tostop {
		tio, err := unix.IoctlGetTermios(int(slave.Fd()), unix.TCGETS)
		if err != nil {
			t.Fatal(err)
		}
		tio.Lflag |= unix.TOSTOP
		if err := unix.IoctlSetTermios(int(slave.Fd()), unix.TCSETS, tio); err != nil {
			t.Fatal(err)
		}
	}
	shell := exec.Command(self, binary, "run", "tty", "--", "sh", "-c", script)
	shell.Env = append(os.Environ(), "DATABASE_URL="+c.dsn, "PGLOCKS_TEST_HELPER=shell")
	if o.background {
		shell.Env = append(shell.Env, "PGLOCKS_TEST_SHELL_BG=1")
	}
	shell.Stdin, shell.Stderr = slave, os.Stderr
	shell.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	stdout, err := shell.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := shell.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	r := &ttyRun{shell: shell, master: master, lines: make(chan string, 16), done: make(chan struct{})}
	go func() {
		out := bufio.NewScanner(stdout)
		for out.Scan() {
			r.lines <- out.Text()
		}
		_ = shell.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		killSession(t, shell.Process.Pid) // every group of it: a background pglocks' too
		<-r.done
		master.Close()
	})
	go func() { _, _ = io.Copy(io.Discard, master) }() // the terminal's echo
	r.expect(t, "ready")
	return r
}

// expect waits for the line want on stdout.
func (r *ttyRun) expect(t *testing.T, want string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case line := <-r.lines:
			if line == want {
				return
			}
			t.Logf("stdout: %s", line)
		case <-r.done:
			t.Fatalf("the shell exited (%v) before %q", r.shell.ProcessState, want)
		case <-timeout:
			t.Fatalf("no %q in 30s", want)
		}
	}
}

func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	fd := int(master.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return master, slave
}

// type writes keys to the terminal.
func (r *ttyRun) typeKeys(t *testing.T, keys string) {
	t.Helper()
	if _, err := r.master.WriteString(keys); err != nil {
		t.Fatal(err)
	}
}

// status waits for pglocks to exit and returns its status.
func (r *ttyRun) status(t *testing.T) int {
	t.Helper()
	select {
	case <-r.done:
		return r.shell.ProcessState.ExitCode()
	case <-time.After(30 * time.Second):
		t.Fatal("pglocks run did not exit in 30s")
		return -1
	}
}

// On a terminal, Ctrl-C interrupts CMD (its process group has the
// terminal; before, CMD inherited pglocks' ignored SIGINT and `sleep` did
// not stop), and CMD reads the terminal.
func TestRunOnTerminal(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	t.Run("CtrlC", func(t *testing.T) {
		r := c.onTerminal(t, `echo ready; exec sleep 600`)
		r.typeKeys(t, "\x03")
		if code := r.status(t); code != 128+2 {
			t.Fatalf("status %d after Ctrl-C, want 130 (CMD killed by SIGINT)", code)
		}
	})
	t.Run("Read", func(t *testing.T) {
		r := c.onTerminal(t, `echo ready; read x; test "$x" = hello`)
		r.typeKeys(t, "hello\n")
		if code := r.status(t); code != 0 {
			t.Fatalf("status %d, want 0: CMD did not read hello from the terminal", code)
		}
	})
	t.Run("CtrlZ", func(t *testing.T) {
		// Ctrl-Z stops the job and pglocks, as a shell expects of a
		// foreground job; fg gives CMD the terminal back.
		r := c.onTerminal(t, `echo ready; read x; test "$x" = hello`)
		r.typeKeys(t, "\x1a")
		r.expect(t, "stopped")
		r.typeKeys(t, "hello\n")
		if code := r.status(t); code != 0 {
			t.Fatalf("status %d after Ctrl-Z and fg, want 0: CMD did not read hello", code)
		}
	})
	// `pglocks run … &` whose CMD reads the terminal: CMD stops (SIGTTIN),
	// and pglocks' job must stop too, so that the shell sees it and fg
	// resumes it with the terminal. Before, pglocks ran on and the shell
	// never saw the job stop: fg hung for ever, holding the lock.
	t.Run("BackgroundRead", func(t *testing.T) {
		r := c.onTerminalWith(t, `echo ready; read x; test "$x" = hello`, ttyOptions{background: true})
		r.expect(t, "stopped")
		r.typeKeys(t, "hello\n")
		if code := r.status(t); code != 0 {
			t.Fatalf("status %d after fg, want 0: CMD did not read hello", code)
		}
	})
	// The same with stty tostop and a CMD that writes to the terminal
	// (SIGTTOU).
	t.Run("BackgroundWrite", func(t *testing.T) {
		r := c.onTerminalWith(t, `echo ready; echo to-the-terminal >&0`, ttyOptions{background: true, tostop: true})
		r.expect(t, "stopped")
		if code := r.status(t); code != 0 {
			t.Fatalf("status %d after fg, want 0: CMD did not write to the terminal", code)
		}
	})
}

// killSession SIGKILLs every process of session sid: the shell's group,
// and pglocks' and CMD's, which hold the stdout the test reads.
func killSession(t *testing.T, sid int) {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Error(err)
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// "PID (COMM) STATE PPID PGRP SESSION …": fields after the last ')'.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 3 && f[3] == strconv.Itoa(sid) {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
}
