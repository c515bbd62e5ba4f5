package main

import (
	"os/exec"
	"runtime"
	"syscall"
)

func init() {
	// The parent-death signal below fires when the thread that started the
	// child exits; keep main, which starts it, on the main thread, which
	// lives as long as the process.
	runtime.LockOSThread()
}

// guardChild makes the kernel send CMD SIGTERM should pglocks die without
// forwarding anything (SIGKILL, a crash): its lock is gone with it, and CMD
// must not go on as if it held it.
func guardChild(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
