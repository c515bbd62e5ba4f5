package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// proc is a process as /proc/PID/stat shows it.
type proc struct {
	pid, ppid, pgrp, sid int
	zombie               bool
}

// procs reads every process from /proc.
func procs() (map[int]proc, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	ps := make(map[int]proc, len(entries))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone since
		}
		if p, ok := parseStat(pid, b); ok {
			ps[pid] = p
		}
	}
	return ps, nil
}

// parseStat reads "PID (COMM) STATE PPID PGRP SESSION …"; COMM may hold
// spaces and parentheses, so the fields start after the last ')'.
func parseStat(pid int, b []byte) (proc, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return proc{}, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 4 {
		return proc{}, false
	}
	p := proc{pid: pid, zombie: string(f[0]) == "Z"}
	var errs [3]error
	p.ppid, errs[0] = strconv.Atoi(string(f[1]))
	p.pgrp, errs[1] = strconv.Atoi(string(f[2]))
	p.sid, errs[2] = strconv.Atoi(string(f[3]))
	return p, errors.Join(errs[:]...) == nil
}

// below returns the pids of every process below root: its children,
// theirs, and so on.
func below(ps map[int]proc, root int) []int {
	children := make(map[int][]int)
	for _, p := range ps {
		children[p.ppid] = append(children[p.ppid], p.pid)
	}
	var out []int
	next := children[root]
	for len(next) > 0 {
		pid := next[len(next)-1]
		next = append(next[:len(next)-1], children[pid]...)
		out = append(out, pid)
	}
	return out
}

// signalTree sends sigs, in order, to every process below this one.
func signalTree(sigs ...unix.Signal) error {
	ps, err := procs()
	if err != nil {
		return err
	}
	for _, pid := range below(ps, os.Getpid()) {
		for _, sig := range sigs {
			if !ps[pid].zombie {
				_ = unix.Kill(pid, sig)
			}
		}
	}
	return nil
}

// killAll SIGKILLs every process below this one (a subreaper) and reaps
// them, until none is left.
func killAll() {
	for {
		_ = signalTree(unix.SIGKILL)
		var ws unix.WaitStatus
		if _, err := unix.Wait4(-1, &ws, 0, nil); errors.Is(err, unix.ECHILD) {
			return
		}
	}
}

// orphaned reports whether process group pgrp is orphaned: no member has
// a parent in another group of the same session, a shell that would
// continue it once stopped. The kernel does not stop such a group on a
// terminal's Ctrl-Z.
func orphaned(pgrp int) bool {
	ps, err := procs()
	if err != nil {
		return true // when in doubt, do not stop: nobody might continue us
	}
	for _, p := range ps {
		if p.pgrp != pgrp || p.zombie {
			continue
		}
		if q, ok := ps[p.ppid]; ok && q.pgrp != pgrp && q.sid == p.sid {
			return false
		}
	}
	return true
}
