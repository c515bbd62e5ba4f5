//go:build !linux

package main

import (
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// superviseIfAsked: there is no supervisor outside Linux.
func superviseIfAsked() (int, bool) { return 0, false }

// direct is a job pglocks runs itself, outside Linux, best effort: there
// is no subreaper and no parent-death signal here. On other Unix systems
// CMD leads a process group of its own, signalled as a whole, unless
// stdin is a terminal (then CMD stays in pglocks' group, as the terminal's
// Ctrl-C and Ctrl-Z reach, and only CMD is signalled); a process that
// leaves the group is not found, and should pglocks be killed outright the
// job runs on without the lock. On Windows only CMD is signalled.
type direct struct {
	cmd       *exec.Cmd
	group     bool
	killAfter time.Duration
	stopping  sync.Once
	exited    chan struct{}
	werr      error
}

func startJob(spec jobSpec) (job, error) {
	argv, killAfter := spec.argv, spec.killAfter
	if spec.session != nil {
		spec.session.Close()
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	group := !isTerminal(os.Stdin) && setGroup(cmd)
	if err := cmd.Start(); err != nil {
		return nil, startError(argv[0], err)
	}
	d := &direct{cmd: cmd, group: group, killAfter: killAfter, exited: make(chan struct{})}
	go d.wait()
	return d, nil
}

// wait waits for CMD, then for what it left in its group: SIGTERM, and
// SIGKILL at --kill-after.
func (d *direct) wait() {
	d.werr = d.cmd.Wait()
	if d.group && groupAlive(d.cmd.Process.Pid) {
		d.stop()
		for tick := time.NewTicker(50 * time.Millisecond); groupAlive(d.cmd.Process.Pid); <-tick.C {
		}
	}
	close(d.exited)
}

func (d *direct) forward(sig os.Signal) {
	if !d.group && sig == os.Interrupt && isTerminal(os.Stdin) {
		return // the terminal sent it to CMD too
	}
	signalJob(d.cmd.Process, d.group, sig)
}

func (d *direct) stop() {
	d.stopping.Do(func() {
		signalJob(d.cmd.Process, d.group, syscall.SIGTERM)
		time.AfterFunc(d.killAfter, func() { signalJob(d.cmd.Process, d.group, os.Kill) })
	})
}

// trust: there is no supervisor here to stop the job should pglocks be
// stopped.
func (d *direct) trust(time.Time) {}

func (d *direct) expired() <-chan struct{} { return nil }

func (d *direct) done() <-chan struct{} { return d.exited }

// contSignals: nothing is passed on besides the forwarded signals.
var contSignals []os.Signal

func (d *direct) err() error { return d.werr }

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
