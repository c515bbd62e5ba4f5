package pgtest_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pglocks/pglocks/pgtest"
)

// childServer is the server of a TestTeardown child, started by
// teardownChildMain before the tests run, so that the child's -test.timeout
// (which runs from m.Run) does not have to cover a server start — tens of
// seconds on a loaded machine.
var childServer *pgtest.Server

// childStandby connects to the standby of a TestClusterTeardown child.
var childStandby string

// teardownChildMain is TestMain in a TestTeardown child: it starts the
// throwaway server, as SharedServer would, then runs the tests. It never
// closes the server: the child is meant to die with it running.
func teardownChildMain(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var err error
	if os.Getenv("PGTEST_CHILD_CLUSTER") != "" {
		var c *pgtest.Cluster
		if c, err = pgtest.StartCluster(ctx, pgtest.WithSynchronousStandby()); err == nil {
			childServer, childStandby = c.Server, c.StandbyDSN("postgres")
		}
	} else {
		childServer, err = pgtest.Start(ctx)
	}
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	return m.Run()
}

// TestTeardownChild is the child process of TestTeardown: it reports where
// its server lives — DATADIR=dir for a local server, CONTAINER=id for a
// Docker one — and then dies as PGTEST_CHILD_FAULT says.
func TestTeardownChild(t *testing.T) {
	fault := os.Getenv("PGTEST_CHILD_FAULT")
	if fault == "" {
		t.Skip("helper process of TestTeardown")
	}
	conn := connect(t, childServer.DSN())
	// In a container, /etc/hostname is the container's short ID.
	where, query := "DATADIR", "show data_directory"
	if childServer.Mode() == pgtest.ModeDocker {
		where, query = "CONTAINER", "select trim(pg_read_file('/etc/hostname'), E'\\n')"
	}
	var v string
	if err := conn.QueryRow(ctxT(t, time.Minute), query).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if childStandby != "" { // a cluster: the standby's directory first
		var standbyDir string
		if err := connect(t, childStandby).QueryRow(ctxT(t, time.Minute), "show data_directory").Scan(&standbyDir); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("STANDBYDIR=%s\n", standbyDir)
	}
	if os.Getenv("PGTEST_CHILD_PGPOOL") != "" { // a Pgpool-II in front, left running
		p, err := pgtest.StartPgpool(ctxT(t, time.Minute), childServer, true)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("PGPOOL=%s %d\n", p.Addr(), pgpoolPID(t, p.Addr()))
	}
	fmt.Printf("%s=%s\n", where, v)
	// Wait until the parent has seen the server's processes.
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if fault == "panic" {
		panic("pgtest child: a deliberate panic")
	}
	// timeout, sigint, sigkill: wait to be killed.
	<-time.After(time.Hour)
}

// TestTeardown proves that a throwaway server leaves nothing behind — no
// postgres process, no temp dir — when its test binary panics, times out,
// gets SIGINT or is SIGKILLed.
func TestTeardown(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short")
	}
	for _, fault := range []string{"panic", "timeout", "sigint", "sigkill"} {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			child := teardownChild(t, fault, "PGTEST_DOCKER=0")
			ctx := ctxT(t, 2*time.Minute)
			pids, tempDir := child.pids, filepath.Dir(child.where)
			waitFor(t, ctx, func() bool {
				_, err := os.Stat(tempDir)
				return os.IsNotExist(err) && !anyAlive(pids)
			}, func() string {
				return fmt.Sprintf("after %s: temp dir %s or server processes %v remain", fault, tempDir, pids)
			})
		})
	}
}

// deadChild is what a TestTeardownChild reported before it died.
type deadChild struct {
	where   string // its data directory, or its container's ID
	pids    []int  // a local server's processes (a cluster's: both nodes')
	standby string // a cluster's standby data directory
	pgpool  string // the address of a Pgpool-II it started
}

// teardownChild runs TestTeardownChild with env, lets it die of fault, and
// returns once it has exited, with what it reported.
func teardownChild(t *testing.T, fault string, env ...string) deadChild {
	t.Helper()
	ctx := ctxT(t, 5*time.Minute)
	// Only the timeout fault relies on -test.timeout; the others die of
	// their fault once told to go.
	timeout := "10m"
	if fault == "timeout" {
		timeout = "10s" // from m.Run, after the child's server started
	}
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestTeardownChild$", "-test.v", "-test.timeout="+timeout)
	cmd.Env = append(append(withoutEnv(os.Environ(), "PGTEST_DSN"), "PGTEST_CHILD_FAULT="+fault), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	goAhead, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var child deadChild
	var log strings.Builder
	sc := bufio.NewScanner(out)
	for child.where == "" && sc.Scan() {
		log.WriteString(sc.Text() + "\n")
		if v, ok := strings.CutPrefix(sc.Text(), "STANDBYDIR="); ok {
			child.standby = v
			child.pids = append(child.pids, serverPIDs(t, v)...)
		} else if v, ok := strings.CutPrefix(sc.Text(), "DATADIR="); ok {
			child.where, child.pids = v, append(child.pids, serverPIDs(t, v)...)
		} else if v, ok := strings.CutPrefix(sc.Text(), "PGPOOL="); ok {
			child.pgpool = v
		} else if v, ok := strings.CutPrefix(sc.Text(), "CONTAINER="); ok {
			child.where = v
		}
	}
	if child.where == "" {
		_ = cmd.Wait()
		t.Fatalf("child never reported where its server lives:\n%s", log.String())
	}
	if _, err := goAhead.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	switch fault {
	case "sigint":
		_ = cmd.Process.Signal(syscall.SIGINT)
	case "sigkill":
		_ = cmd.Process.Kill()
	}
	for sc.Scan() { // drain until the child exits
	}
	if err := cmd.Wait(); err == nil {
		t.Fatalf("child exited cleanly; the %s fault did not happen", fault)
	}
	return child
}

// serverPIDs returns the postmaster of dataDir and its children.
func serverPIDs(t *testing.T, dataDir string) []int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	postmaster, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil {
		t.Fatal(err)
	}
	pids := []int{postmaster}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		pid, ppid, _, ok := procStat(f)
		if ok && ppid == postmaster {
			pids = append(pids, pid)
		}
	}
	if len(pids) < 2 {
		t.Fatalf("postmaster %d has no child processes; cannot check them", postmaster)
	}
	return pids
}

// procStat reads pid, ppid and state from a /proc/N/stat file.
func procStat(path string) (pid, ppid int, state byte, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, 0, false
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 2 {
		return 0, 0, 0, false
	}
	pid, _ = strconv.Atoi(strings.Fields(s)[0])
	ppid, _ = strconv.Atoi(fields[1])
	return pid, ppid, fields[0][0], true
}

// anyAlive reports whether any of pids runs (a zombie does not).
func anyAlive(pids []int) bool {
	for _, pid := range pids {
		if _, _, state, ok := procStat(fmt.Sprintf("/proc/%d/stat", pid)); ok && state != 'Z' && state != 'X' {
			return true
		}
	}
	return false
}

func withoutEnv(env []string, name string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// waitFor polls cond until it holds or ctx ends; then it fails with msg().
func waitFor(t *testing.T, ctx context.Context, cond func() bool, msg func() string) {
	t.Helper()
	for delay := time.Millisecond; !cond(); delay = min(2*delay, 100*time.Millisecond) {
		select {
		case <-ctx.Done():
			t.Fatal(msg())
		case <-time.After(delay):
		}
	}
}
