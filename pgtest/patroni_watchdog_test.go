package pgtest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// patroniTrace is what a child test binary reports of the cluster it
// started: every process of it, every address it listens on, and, with
// the nodes in namespaces, those namespaces (the switch's holds the nft
// table that cuts a node off) and our end of the link to the switch.
type patroniTrace struct {
	Dir   string
	Procs map[int]uint64 // pid → start time, to tell a reused pid apart
	Addrs []string
	Netns []string
	Links []string
}

const watchdogChild = "PGTEST_PATRONI_WATCHDOG_CHILD"

// TestPatroniWatchdog proves that a Patroni cluster does not outlive a
// test binary killed without a chance to clean up: a child test binary
// starts a cluster, cuts a node off (where the nodes live in namespaces:
// the switch then holds drop rules), reports its processes (etcd,
// HAProxy, each Patroni, each postmaster and its children), addresses,
// namespaces and link, and is SIGKILLed; within 30 s no process of the
// cluster is left, no address answers, no namespace or link is left and
// its dir is gone. Opt-in: PGLOCKS_PATRONI=1.
func TestPatroniWatchdog(t *testing.T) {
	if os.Getenv(watchdogChild) == "1" {
		patroniChild(t)
		return
	}
	if os.Getenv("PGLOCKS_PATRONI") != "1" {
		t.Skip("Patroni tests are opt-in: set PGLOCKS_PATRONI=1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestPatroniWatchdog$", "-test.count", "1", "-test.v")
	cmd.Env = append(os.Environ(), watchdogChild+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tr := readTrace(t, ctx, cmd, out)
	killed := time.Now()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for left := tr.left(); left != ""; left = tr.left() {
		if time.Since(killed) > 30*time.Second {
			t.Fatalf("30 s after SIGKILL of the test binary: %s", left)
		}
		time.Sleep(50 * time.Millisecond) // processes of another process tree: poll their end
	}
	t.Logf("%d processes, %d addresses, %d namespaces and %d links of the cluster gone %v after SIGKILL of the test binary",
		len(tr.Procs), len(tr.Addrs), len(tr.Netns), len(tr.Links), time.Since(killed).Round(time.Millisecond))
}

// readTrace reads the child's report, failing t if the child exits or
// ctx ends first.
func readTrace(t *testing.T, ctx context.Context, cmd *exec.Cmd, out interface{ Read([]byte) (int, error) }) patroniTrace {
	t.Helper()
	got := make(chan patroniTrace, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), "PATRONI-TRACE "); ok {
				var tr patroniTrace
				if json.Unmarshal([]byte(s), &tr) == nil {
					got <- tr
				}
			}
		}
		close(got)
	}()
	select {
	case tr, ok := <-got:
		if !ok {
			t.Fatal("the child test binary exited without starting a cluster")
		}
		return tr
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		t.Fatal("the child test binary started no cluster in time")
	}
	return patroniTrace{}
}

// left says what of the cluster still runs or exists, "" if nothing.
func (tr patroniTrace) left() string {
	var b strings.Builder
	for pid, start := range tr.Procs {
		if st, ok := procStat(pid); ok && st.start == start && st.state != 'Z' && st.state != 'X' {
			cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
			fmt.Fprintf(&b, "process %d (%s) runs; ", pid, strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	linksLeft := 0
	for _, l := range tr.Links {
		if _, err := os.Stat("/sys/class/net/" + l); err == nil {
			linksLeft++
			fmt.Fprintf(&b, "link %s exists; ", l)
		}
	}
	// With our link to the switch gone, the cluster's addresses are no
	// longer ours: a connection to one goes to the default route, where
	// anything may answer.
	for _, addr := range tr.Addrs {
		if len(tr.Links) > 0 && linksLeft == 0 {
			break
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = c.Close()
			fmt.Fprintf(&b, "%s answers; ", addr)
		}
	}
	for _, ns := range tr.Netns {
		if _, err := os.Stat("/run/netns/" + ns); err == nil {
			fmt.Fprintf(&b, "namespace %s exists; ", ns)
		}
	}
	if _, err := os.Stat(tr.Dir); err == nil {
		fmt.Fprintf(&b, "%s exists", tr.Dir)
	}
	return b.String()
}

// patroniChild starts a cluster, reports it on stdout and waits to be
// killed.
func patroniChild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, err := StartPatroni(ctx, PatroniOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr := patroniTrace{Dir: p.dir, Procs: map[int]uint64{},
		Addrs: []string{p.host + ":" + strconv.Itoa(p.etcd), "127.0.0.1:" + strconv.Itoa(p.haport)}}
	if p.net != nil {
		if err := p.Partition(p.nodes[len(p.nodes)-1].name); err != nil {
			t.Fatal(err)
		}
		tr.Links = []string{p.net.rootIf}
		tr.Netns = append(tr.Netns, p.net.sw)
		for i := range p.nodes {
			tr.Netns = append(tr.Netns, p.net.nodeNS(i))
		}
	}
	groups := map[int]bool{}
	for _, pr := range p.procs {
		groups[pr.cmd.Process.Pid] = true
	}
	var roots []int
	for _, n := range p.nodes {
		groups[n.proc.cmd.Process.Pid] = true
		roots = append(roots, n.postmasterPID())
		tr.Addrs = append(tr.Addrs, n.addr(n.pgPort), n.addr(n.restPort))
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := procStat(pid); ok && (groups[st.pgrp] || slices.Contains(roots, pid) || slices.Contains(roots, st.ppid)) {
			tr.Procs[pid] = st.start
		}
	}
	b, _ := json.Marshal(tr)
	fmt.Printf("PATRONI-TRACE %s\n", b)
	select {} // hold the cluster until the parent's SIGKILL
}
