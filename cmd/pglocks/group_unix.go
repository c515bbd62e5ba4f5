//go:build unix && !linux

package main

import (
	"os"
	"os/exec"
	"syscall"
)

// setGroup makes CMD lead a process group of its own.
func setGroup(cmd *exec.Cmd) bool {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return true
}

// signalJob signals CMD's process group, or CMD alone.
func signalJob(p *os.Process, group bool, sig os.Signal) {
	if n, ok := sig.(syscall.Signal); ok && group {
		_ = syscall.Kill(-p.Pid, n)
		return
	}
	_ = p.Signal(sig)
}

// groupAlive reports whether process group pgid has a member left.
func groupAlive(pgid int) bool { return syscall.Kill(-pgid, 0) == nil }
