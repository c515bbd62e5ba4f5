package main

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// terminal is the controlling terminal on stdin. CMD's process group gets
// it when pglocks' group has it: Ctrl-C and Ctrl-Z then reach CMD's group
// (and not pglocks'), and CMD reads the terminal.
type terminal struct {
	ok  bool // stdin is the controlling terminal
	fg  bool // pglocks' group had the terminal at the start: CMD's group gets it
	own int  // pglocks' process group, to give it back to
}

// terminalOf returns stdin's terminal, as pglocks' group (own) sees it.
func terminalOf(own int) terminal {
	pgrp, err := unix.IoctlGetInt(0, unix.TIOCGPGRP) // ENOTTY: not our terminal
	return terminal{ok: err == nil, fg: err == nil && pgrp == own, own: own}
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
// other group, if 0) has it: a shell that took it back keeps it.
func (t terminal) reclaim(pgrp int) {
	if !t.ok {
		return
	}
	if fg := t.foreground(); fg > 0 && fg != t.own && (pgrp == 0 || fg == pgrp) {
		_ = unix.IoctlSetPointerInt(0, unix.TIOCSPGRP, t.own)
	}
}

// give gives the terminal to group pgrp if pglocks' group has it now
// (whatever it had at the start: a job started with & and then fg).
func (t terminal) give(pgrp int) {
	if t.ok && t.foreground() == t.own {
		_ = unix.IoctlSetPointerInt(0, unix.TIOCSPGRP, pgrp)
	}
}

// cmdStopped: CMD was stopped with signal sig on a terminal: Ctrl-Z
// (SIGTSTP), or reading it (SIGTTIN) or writing it with stty tostop
// (SIGTTOU) from the background, or SIGSTOP. As the shell sees pglocks'
// group only, that group stops too, with the same signal, after taking
// the terminal back, so that the shell sees its job stop; its fg or bg
// continues pglocks, which tells the supervisor (resume). pglocks ignores
// SIGTTOU (it writes its messages from the background): SIGTSTP stands
// in for it.
func (s *supervisor) cmdStopped(sig syscall.Signal) {
	if !s.tty.ok || s.cmdDone || s.stopping {
		return // not a terminal's job: whoever stopped CMD continues it
	}
	if (sig == unix.SIGTTIN || sig == unix.SIGTTOU) && s.tty.foreground() == s.tty.own {
		s.cont() // pglocks' group has the terminal (fg came first): CMD gets it
		return
	}
	if orphaned(s.tty.own) {
		s.stoppedOrphan(sig)
		return
	}
	s.tty.reclaim(s.pid)
	if sig == unix.SIGTTOU {
		sig = unix.SIGTSTP
	}
	_ = unix.Kill(-s.tty.own, sig)
}

// stoppedOrphan: CMD stopped, but pglocks' group is orphaned: no shell
// would continue it. On Ctrl-Z CMD is continued at once, as the kernel
// does not stop such a group on Ctrl-Z. Stopped on the terminal from the
// background, it would only stop again: it stays stopped, and pglocks
// says so once.
func (s *supervisor) stoppedOrphan(sig syscall.Signal) {
	switch {
	case sig == unix.SIGTSTP:
		s.cont()
	case (sig == unix.SIGTTIN || sig == unix.SIGTTOU) && !s.warnedTTY:
		s.warnedTTY = true
		fmt.Fprintf(os.Stderr, "pglocks: %s stopped on the terminal (%v) from the background, and no shell can continue it; "+
			"it holds the lock until it is continued or killed\n", s.name, sig)
	}
}

// resume: pglocks was continued (fg or bg). CMD is continued if it is
// stopped, with the terminal if pglocks' group has it now (fg).
func (s *supervisor) resume() {
	if s.stopped && !s.cmdDone {
		s.cont()
	}
}

// cont continues CMD, giving it the terminal if pglocks' group has it.
func (s *supervisor) cont() {
	s.tty.give(s.pid)
	s.stopped = false
	_ = unix.Kill(-s.pid, unix.SIGCONT)
}
