package pgtest_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

// backendOf returns the server pid serving conn's next statement and the
// database it is in.
func backendOf(t *testing.T, conn *pgx.Conn) (pid int32, db string) {
	t.Helper()
	if err := conn.QueryRow(ctxT(t, 30*time.Second), "select pg_backend_pid(), current_database()").Scan(&pid, &db); err != nil {
		t.Fatal(err)
	}
	return pid, db
}

// serverPeerPort returns the client port the server sees for backend pid.
func serverPeerPort(t *testing.T, direct *pgx.Conn, pid int32) int {
	t.Helper()
	var port int
	if err := direct.QueryRow(ctxT(t, 30*time.Second), "select client_port from pg_stat_activity where pid = $1", pid).Scan(&port); err != nil {
		t.Fatal(err)
	}
	return port
}

func localPort(conn *pgx.Conn) int {
	_, p, _ := net.SplitHostPort(conn.PgConn().Conn().LocalAddr().String())
	n, _ := strconv.Atoi(p)
	return n
}

// TestBouncerSession: through a session-mode bouncer each client keeps one
// server backend, in the test's own database, and the server sees the
// bouncer, not the client, at the other end.
func TestBouncerSession(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	b, dsn := db.Bouncer(t, pgtest.PoolSession)
	if b.Mode() != pgtest.PoolSession {
		t.Fatalf("mode %q", b.Mode())
	}
	c1, c2 := connect(t, dsn), connect(t, dsn)
	direct := db.Conn(t)
	p1, name := backendOf(t, c1)
	p2, _ := backendOf(t, c2)
	if name != db.Name {
		t.Fatalf("through the bouncer: database %q, want %q", name, db.Name)
	}
	if p1 == p2 {
		t.Fatalf("two clients share backend %d in session mode", p1)
	}
	for range 3 {
		if p, _ := backendOf(t, c1); p != p1 {
			t.Fatalf("client moved from backend %d to %d in session mode", p1, p)
		}
	}
	if sp, lp := serverPeerPort(t, direct, p1), localPort(c1); sp == lp {
		t.Fatalf("server sees the client's own port %d: not through the bouncer", lp)
	}
	closeAndCheck(t, b, direct, db.Name)
}

// TestBouncerTransaction: through a transaction-mode bouncer a client's
// statements run on whichever backend is free: while another client's
// transaction holds the backend the first used, the first moves.
func TestBouncerTransaction(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	b, dsn := db.Bouncer(t, pgtest.PoolTransaction)
	// PgBouncer 1.18 keeps no prepared statements in transaction mode.
	dsn += "&default_query_exec_mode=simple_protocol"
	c1, c2 := connect(t, dsn), connect(t, dsn)
	direct := db.Conn(t)
	seen := map[int32]bool{}
	p1, _ := backendOf(t, c1)
	seen[p1] = true
	ctx := ctxT(t, 30*time.Second)
	tx, err := c2.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var p2 int32
	if err := tx.QueryRow(ctx, "select pg_backend_pid()").Scan(&p2); err != nil {
		t.Fatal(err)
	}
	p3, _ := backendOf(t, c1)
	seen[p3] = true
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("client 1 on backends %d then %d; client 2's transaction on %d", p1, p3, p2)
	if p3 == p2 {
		t.Fatalf("client 1 ran on backend %d inside client 2's transaction", p2)
	}
	if len(seen) < 2 {
		t.Fatalf("client 1 stayed on backend %d although client 2's transaction took it (%d)", p1, p2)
	}
	closeAndCheck(t, b, direct, db.Name)
}

// pooler is a Bouncer or a Pgpool.
type pooler interface {
	Close() error
	Addr() string
}

// TestBouncerRoundRobin: a bouncer with BouncerRoundRobin and a pool of
// two hands a client's consecutive statements to the two server sessions
// in turn (the least recently used first), as the server sees it.
func TestBouncerRoundRobin(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	b, dsn := db.Bouncer(t, pgtest.PoolTransaction, pgtest.BouncerPoolSize(2), pgtest.BouncerRoundRobin())
	dsn += "&default_query_exec_mode=simple_protocol"
	c1, c2 := connect(t, dsn), connect(t, dsn)
	ctx := ctxT(t, 30*time.Second)
	tx, err := c2.Begin(ctx) // two server sessions open at once, both idle after
	if err != nil {
		t.Fatal(err)
	}
	backendOf(t, c1)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var pids []int32
	for range 4 {
		p, _ := backendOf(t, c1)
		pids = append(pids, p)
	}
	t.Logf("one client's statements ran on backends %v", pids)
	for i := 1; i < len(pids); i++ {
		if pids[i] == pids[i-1] {
			t.Fatalf("consecutive statements on backend %d: not in turn (%v)", pids[i], pids)
		}
	}
	direct := db.Conn(t)
	var n int
	if err := direct.QueryRow(ctx, "select count(distinct pid) from pg_stat_activity where datname = $1 and pid = any($2)", db.Name, pids).Scan(&n); err != nil || n != 2 {
		t.Fatalf("server sessions of the pool: %d (%v), want 2", n, err)
	}
	closeAndCheck(t, b, direct, db.Name)
}

// TestBouncerStatement: a statement-mode bouncer runs single statements
// and ends a client that opens a transaction.
func TestBouncerStatement(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	b, dsn := db.Bouncer(t, pgtest.PoolStatement)
	c := connect(t, dsn+"&default_query_exec_mode=simple_protocol")
	backendOf(t, c)
	ctx := ctxT(t, 30*time.Second)
	_, err := c.Exec(ctx, "begin")
	if err == nil {
		_, err = c.Exec(ctx, "select 1")
	}
	if err == nil || !strings.Contains(err.Error(), "statement pooling") {
		t.Fatalf("a transaction through statement pooling: %v, want it refused", err)
	}
	closeAndCheck(t, b, db.Conn(t), db.Name)
}

// closeAndCheck closes b and waits until the server has no session left in
// dbname but direct's, and the pooler's files are gone.
func closeAndCheck(t *testing.T, b pooler, direct *pgx.Conn, dbname string) {
	t.Helper()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second)
	for {
		var n int
		err := direct.QueryRow(ctx, "select count(*) from pg_stat_activity where datname = $1 and pid <> pg_backend_pid()", dbname).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d sessions still in %s after the bouncer closed", n, dbname)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if _, err := net.DialTimeout("tcp", b.Addr(), time.Second); err == nil {
		t.Fatalf("something still listens on %s", b.Addr())
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestBouncerTeardownChild is the child process of TestBouncerTeardown: it
// starts a bouncer, reports its address, and waits to be killed.
func TestBouncerTeardownChild(t *testing.T) {
	if os.Getenv("PGTEST_CHILD_FAULT") != "bouncer" {
		t.Skip("helper process of TestBouncerTeardown")
	}
	ctx := ctxT(t, time.Minute)
	b, err := pgtest.StartBouncer(ctx, childServer, pgtest.PoolTransaction)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("BOUNCER=%s\n", b.Addr())
	<-time.After(time.Hour)
}

// TestBouncerTeardown: a bouncer whose test binary is SIGKILLed is killed
// by its watchdog: nothing listens on its address afterwards.
func TestBouncerTeardown(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short")
	}
	ctx := ctxT(t, 2*time.Minute)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBouncerTeardownChild$", "-test.v", "-test.timeout=10m")
	cmd.Env = append(withoutEnv(os.Environ(), "PGTEST_DSN"), "PGTEST_CHILD_FAULT=bouncer", "PGTEST_DOCKER=0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var addr string
	var log strings.Builder
	sc := bufio.NewScanner(out)
	for addr == "" && sc.Scan() {
		log.WriteString(sc.Text() + "\n")
		if v, ok := strings.CutPrefix(sc.Text(), "BOUNCER="); ok {
			addr = v
		}
	}
	if addr == "" {
		_ = cmd.Wait()
		t.Skipf("child started no bouncer (pgbouncer missing?):\n%s", log.String())
	}
	if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err != nil {
		t.Fatalf("the child's bouncer does not listen on %s: %v", addr, err)
	} else {
		_ = c.Close()
	}
	_ = cmd.Process.Kill()
	for sc.Scan() {
	}
	_ = cmd.Wait()
	waitFor(t, ctx, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err != nil
	}, func() string { return "the bouncer still listens on " + addr + " after its test binary was killed" })
}
