package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// PausePostmaster stops name's PostgreSQL — its postmaster and every
// process it started, backends included — with SIGSTOP, as a machine
// frozen by its hypervisor or swapping would be; Patroni itself runs on
// and finds its own queries unanswered. [Patroni.ResumePostmaster] sends
// SIGCONT to the same processes.
func (p *Patroni) PausePostmaster(name string) error {
	return p.signalPostgres(name, syscall.SIGSTOP)
}

// ResumePostmaster sends SIGCONT to name's postmaster and its children
// (see [Patroni.PausePostmaster]).
func (p *Patroni) ResumePostmaster(name string) error {
	return p.signalPostgres(name, syscall.SIGCONT)
}

// signalPostgres sends sig to name's postmaster and its children: the
// postmaster first when stopping (it starts no process while stopped),
// last when continuing.
func (p *Patroni) signalPostgres(name string, sig syscall.Signal) error {
	n, err := p.node(name)
	if err != nil {
		return err
	}
	pid := n.postmasterPID()
	if pid <= 0 {
		return fmt.Errorf("pgtest: %s has no postmaster running", name)
	}
	if sig == syscall.SIGSTOP {
		if err := syscall.Kill(pid, sig); err != nil {
			return fmt.Errorf("pgtest: %s: postmaster %d: %w", name, pid, err)
		}
	}
	for _, c := range childrenOf(pid) {
		_ = syscall.Kill(c, sig) // a child may have exited meanwhile
	}
	if sig != syscall.SIGSTOP {
		if err := syscall.Kill(pid, sig); err != nil {
			return fmt.Errorf("pgtest: %s: postmaster %d: %w", name, pid, err)
		}
	}
	return nil
}

// childrenOf returns the pids whose parent is ppid, from /proc.
func childrenOf(ppid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := procStat(pid); ok && st.ppid == ppid {
			out = append(out, pid)
		}
	}
	return out
}

// procStatus is what /proc/pid/stat says of a process.
type procStatus struct {
	state byte // R, S, D, T, Z, …
	ppid  int
	pgrp  int
	start uint64 // clock ticks since boot: tells a reused pid apart
}

// procStat reads /proc/pid/stat; false if the process is gone.
func procStat(pid int) (procStatus, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStatus{}, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command may hold spaces and parentheses
	if i < 0 || i+2 >= len(s) {
		return procStatus{}, false
	}
	f := strings.Fields(s[i+2:]) // f[0] is field 3, the state
	if len(f) < 20 {
		return procStatus{}, false
	}
	var st procStatus
	st.state = f[0][0]
	st.ppid, _ = strconv.Atoi(f[1])
	st.pgrp, _ = strconv.Atoi(f[2])
	st.start, _ = strconv.ParseUint(f[19], 10, 64)
	return st, true
}

// waitDead waits up to d for pid to exit (gone, or a zombie its parent has
// not reaped yet).
func waitDead(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		st, ok := procStat(pid)
		if !ok || st.state == 'Z' || st.state == 'X' {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond) // the process is no child of ours: poll its end
	}
}

// PatroniFault names a fault that [Patroni.Fault] injects on the primary.
type PatroniFault string

// The faults [Patroni.Fault] injects.
const (
	// FaultSwitchover is patronictl switchover to any other node.
	FaultSwitchover PatroniFault = "switchover"
	// FaultKillNode is SIGKILL of the primary's Patroni and postmaster at
	// once (see [Patroni.KillNode]): the leader key expires after TTL.
	FaultKillNode PatroniFault = "kill-node"
	// FaultKillPostmaster is SIGKILL of the primary's postmaster alone
	// (see [Patroni.KillPostmaster]): its Patroni restarts it or fails
	// over.
	FaultKillPostmaster PatroniFault = "kill-postmaster"
	// FaultPause stops the primary's PostgreSQL (see
	// [Patroni.PausePostmaster]) until another node is a writable
	// primary, then continues it: the old primary wakes up still
	// believing it is one, until its Patroni demotes it.
	FaultPause PatroniFault = "pause"
	// FaultPauseLong is FaultPause continued 10 s after another node
	// accepts writes, long enough for clients to move to it, as a stall
	// that outlasts the failover would.
	FaultPauseLong PatroniFault = "pause-long"
	// FaultPartition cuts the primary off the network — from etcd, the
	// clients, HAProxy and its standbys — (see [Patroni.Partition]) until
	// [Failover.Recover]: its Patroni demotes it, the leader key expires
	// after TTL and a standby is promoted.
	FaultPartition PatroniFault = "partition"
)

// Failover is what one [Patroni.Fault] did.
type Failover struct {
	Fault    PatroniFault
	Old, New string        // the primary before and after
	At       time.Time     // when the fault was injected
	Writable time.Duration // from At until New accepted a write
	Resumed  time.Time     // FaultPause, FaultPauseLong: when the old primary was continued
	// ReadOnly is, for FaultPartition, the time from At until the old
	// primary, asked through its Unix socket (beyond the cut), was first
	// found no primary: its Patroni had begun to demote it.
	ReadOnly time.Duration

	p *Patroni
}

// Fault injects f on the current primary and returns once a primary (for
// FaultKillPostmaster possibly the same node; for the others, another
// node) accepts a write — and, for FaultPartition, once the old primary
// is no primary any more. A FaultPause's old primary is continued then; a
// FaultPartition's stays cut off. Call [Failover.Recover] before the next
// fault.
func (p *Patroni) Fault(ctx context.Context, f PatroniFault) (*Failover, error) {
	fo := &Failover{Fault: f, Old: p.Primary(ctx), p: p}
	if fo.Old == "" {
		return nil, errors.New("pgtest: fault: no primary now")
	}
	not := fo.Old
	fo.At = time.Now()
	var err error
	switch f {
	case FaultSwitchover:
		err = p.Switchover(ctx, "")
	case FaultKillNode:
		err = p.KillNode(fo.Old)
	case FaultKillPostmaster:
		err, not = p.KillPostmaster(fo.Old), ""
	case FaultPause, FaultPauseLong:
		err = p.PausePostmaster(fo.Old)
	case FaultPartition:
		err = p.Partition(fo.Old)
	default:
		err = fmt.Errorf("pgtest: no fault %q", f)
	}
	if err != nil {
		return nil, err
	}
	var demoted <-chan time.Time
	if f == FaultPartition {
		demoted = p.watchDemotion(ctx, fo.Old)
	}
	fo.New, err = p.WaitPrimary(ctx, not)
	fo.Writable = time.Since(fo.At)
	if demoted != nil && err == nil {
		select {
		case at := <-demoted:
			fo.ReadOnly = at.Sub(fo.At)
		case <-ctx.Done():
			err = fmt.Errorf("pgtest: partition: %s is still a primary, seen through its Unix socket, %v after it was cut off: %w\n%s",
				fo.Old, time.Since(fo.At).Round(time.Millisecond), context.Cause(ctx), p.view())
		}
	}
	if f == FaultPauseLong && err == nil {
		select { // the stall's length, not a synchronization
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
		}
	}
	if f == FaultPause || f == FaultPauseLong {
		fo.Resumed = time.Now()
		if rerr := p.ResumePostmaster(fo.Old); err == nil {
			err = rerr
		}
	}
	return fo, err
}

// Recover restarts a killed node, or heals a partitioned one, and waits
// until the cluster has a writable primary, every other node a replica
// streaming from it (the old primary rewound and rejoined) and, in
// synchronous mode, a synchronous standby again — all read from the
// primary, the replicas and etcd (see [Patroni.WaitSynchronous]): ready
// for the next fault.
func (fo *Failover) Recover(ctx context.Context) error {
	if fo == nil || fo.p == nil {
		return errors.New("pgtest: recover: no failover (a nil *Failover, or not one Patroni.Fault returned)")
	}
	switch fo.Fault {
	case FaultKillNode:
		if err := fo.p.StartNode(fo.Old); err != nil {
			return err
		}
	case FaultPartition:
		if err := fo.p.Heal(fo.Old); err != nil {
			return err
		}
	}
	_, err := fo.p.WaitSynchronous(ctx)
	return err
}

// KillPostmaster sends SIGKILL to name's postmaster alone, and returns
// once it has exited; its Patroni lives on and decides what follows (a
// restart in place, or a failover).
func (p *Patroni) KillPostmaster(name string) error {
	n, err := p.node(name)
	if err != nil {
		return err
	}
	pid := n.postmasterPID()
	if pid <= 0 {
		return fmt.Errorf("pgtest: %s has no postmaster running", name)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("pgtest: %s: postmaster %d: %w", name, pid, err)
	}
	if !waitDead(pid, 10*time.Second) {
		return fmt.Errorf("pgtest: %s: postmaster %d still runs 10 s after SIGKILL", name, pid)
	}
	return nil
}

// KillNode sends SIGKILL to name's Patroni and its postmaster at once, as a
// crashed machine would: the leader key expires after TTL and a replica is
// promoted. The node stays down until [Patroni.StartNode].
func (p *Patroni) KillNode(name string) error {
	n, err := p.node(name)
	if err != nil {
		return err
	}
	pid := n.postmasterPID()
	if err := syscall.Kill(-n.proc.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return err
	}
	<-n.proc.done
	if pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return nil
}

// StartNode starts name's Patroni again after [Patroni.KillNode]; it
// rejoins as a replica (pg_rewind if need be).
func (p *Patroni) StartNode(name string) error {
	n, err := p.node(name)
	if err != nil {
		return err
	}
	select {
	case <-n.proc.done:
	default:
		return fmt.Errorf("pgtest: %s is running", name)
	}
	return n.start(p)
}

// Switchover asks Patroni (patronictl switchover) to hand the primary's
// role from the current primary to candidate ("" lets Patroni choose).
func (p *Patroni) Switchover(ctx context.Context, candidate string) error {
	leader := p.Primary(ctx)
	if leader == "" {
		return errors.New("pgtest: switchover: no primary now")
	}
	args := []string{"-c", p.nodes[0].configPath, "switchover", "--leader", leader, "--force"}
	if candidate != "" {
		args = append(args, "--candidate", candidate)
	}
	out, err := exec.CommandContext(ctx, "patronictl", args...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Successfully switched over") {
		return fmt.Errorf("pgtest: patronictl switchover: %v: %s", err, out)
	}
	return nil
}
