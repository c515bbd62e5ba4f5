package main

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// terminal is the controlling terminal on stdin, which CMD's process group
// gets when pglocks' group has it: Ctrl-C and Ctrl-Z then reach CMD's
// group (and not pglocks'), and CMD reads the terminal.
type terminal struct {
	fg  bool // pglocks' group had the terminal: CMD's group gets it
	own int  // pglocks' process group, to give it back to
}

func terminalOf() terminal {
	own := unix.Getpgrp()
	pgrp, err := unix.IoctlGetInt(0, unix.TIOCGPGRP) // ENOTTY: not our terminal
	return terminal{fg: err == nil && pgrp == own, own: own}
}

// foreground returns the terminal's foreground process group.
func (t terminal) foreground() int {
	pgrp, err := unix.IoctlGetInt(0, unix.TIOCGPGRP)
	if err != nil {
		return -1
	}
	return pgrp
}

// reclaim gives the terminal back to pglocks' group if group pgrp (any
// other group, if 0) still has it: a shell that took it back keeps it.
func (t terminal) reclaim(pgrp int) {
	if !t.fg {
		return
	}
	if fg := t.foreground(); fg > 0 && fg != t.own && (pgrp == 0 || fg == pgrp) {
		_ = unix.IoctlSetPointerInt(0, unix.TIOCSPGRP, t.own)
	}
}

// give gives the terminal to group pgrp if pglocks' group has it.
func (t terminal) give(pgrp int) {
	if t.fg && t.foreground() == t.own {
		_ = unix.IoctlSetPointerInt(0, unix.TIOCSPGRP, pgrp)
	}
}

// cmdStopped: CMD, which has the terminal, was stopped (Ctrl-Z). As the
// shell sees pglocks only, pglocks' group stops too (the supervisor
// with it), after taking the terminal back; the shell's fg or bg continues
// it, and resume continues CMD. Without a shell to do so (an orphaned
// group), CMD is continued at once, as the kernel does not stop such a
// group on Ctrl-Z.
func (s *supervisor) cmdStopped() {
	if !s.tty.fg || s.cmdDone {
		return // not a terminal's job: whoever stopped CMD continues it
	}
	if orphaned(s.tty.own) {
		_ = unix.Kill(-s.pid, unix.SIGCONT)
		return
	}
	s.tty.reclaim(s.pid)
	s.suspended = true
	_ = unix.Kill(0, syscall.SIGTSTP)
}

// resume continues CMD once pglocks' group is continued (SIGCONT: fg or
// bg), giving it the terminal if pglocks' group has it (fg).
func (s *supervisor) resume() {
	if !s.suspended {
		return
	}
	s.suspended = false
	if s.cmdDone {
		return
	}
	s.tty.give(s.pid)
	_ = unix.Kill(-s.pid, unix.SIGCONT)
}
