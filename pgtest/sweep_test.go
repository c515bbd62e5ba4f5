package pgtest_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks/pgtest"
)

// TestSweepChild is TestSweep's test binary that dies: it makes databases
// on PGTEST_DSN, reports them, and waits to be killed.
func TestSweepChild(t *testing.T) {
	if os.Getenv("PGTEST_CHILD_SWEEP") == "" {
		t.Skip("helper process of TestSweep")
	}
	a, b := pgtest.New(t), pgtest.New(t)
	pgtest.NewTx(t)
	fmt.Printf("SWEEP db=%s\nSWEEP db=%s\nSWEEP ready\n", a.Name, b.Name)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until killed
}

// TestSweep proves the rule of what dead runs leave on a PGTEST_DSN server:
// a test binary is SIGKILLed with its databases made; a new run sweeps every
// one of them, and none of a run still alive. Its server is its own: on
// the one that go test's binaries share, another binary starting would
// sweep the killed run's databases before they are counted.
func TestSweep(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewServer(t).DSN()
	live := runOn(t, dsn)
	defer live.Close()
	liveDB, err := live.CreateDatabase(ctxT(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestSweepChild$", "-test.v")
	cmd.Env = append(os.Environ(), "PGTEST_CHILD_SWEEP=1", "PGTEST_DSN="+dsn)
	stdin, _ := cmd.StdinPipe()
	defer stdin.Close()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var dead []string
	for sc := bufio.NewScanner(out); sc.Scan() && sc.Text() != "SWEEP ready"; {
		if name, ok := strings.CutPrefix(sc.Text(), "SWEEP db="); ok {
			dead = append(dead, name)
		}
	}
	if len(dead) != 2 {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child reported %v", dead)
	}
	_ = cmd.Process.Signal(os.Kill)
	_ = cmd.Wait()
	// The child's run id is in its databases' names; wait until the
	// server has ended its sessions, and with them the run's lock (the
	// sweep leaves a database anyone is connected to).
	run, _ := strconv.ParseUint(strings.Split(dead[0], "_")[1], 16, 32)
	conn := connect(t, dsn)
	ctx := ctxT(t, 2*time.Minute)
	for held := true; held; {
		if err := conn.QueryRow(ctx, `select exists(select 1 from pg_locks where locktype = 'advisory'
			and classid = x'70677472'::int::oid and objid = $1::int8::oid and objsubid = 2)
			or exists(select 1 from pg_stat_activity where datname like $2)`,
			run, "pgtest\\_"+strings.Split(dead[0], "_")[1]+"\\_%").Scan(&held); err != nil {
			t.Fatal(err)
		}
	}
	var left int
	if err := conn.QueryRow(ctx, "select count(*) from pg_database where datname like $1",
		"pgtest\\_"+strings.Split(dead[0], "_")[1]+"\\_%").Scan(&left); err != nil || left < 3 {
		t.Fatalf("the killed run left %d databases (%v), want its 2, its template and its NewTx one", left, err)
	}
	next := runOn(t, dsn) // its start sweeps
	defer next.Close()
	if err := conn.QueryRow(ctx, "select count(*) from pg_database where datname like $1",
		"pgtest\\_"+strings.Split(dead[0], "_")[1]+"\\_%").Scan(&left); err != nil || left != 0 {
		t.Fatalf("after the sweep, %d databases of the killed run are left (%v)", left, err)
	}
	var alive bool
	if err := conn.QueryRow(ctx, "select exists(select 1 from pg_database where datname = $1)", liveDB.Name).Scan(&alive); err != nil || !alive {
		t.Fatalf("the sweep dropped the live run's database %s (%v)", liveDB.Name, err)
	}
}
