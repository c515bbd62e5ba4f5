package pgtest_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pglocks/pglocks/pgtest"
)

// TestPgpool: through Pgpool-II each client keeps one backend of the
// test's own database for as long as it is connected; the server sees
// pgpool, not the client, at the other end; with the connection cache a
// client that leaves frees its session locks (DISCARD ALL) and its backend
// serves the next client.
func TestPgpool(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	direct := db.Conn(t)
	for _, cache := range []bool{false, true} {
		p, dsn := db.Pgpool(t, cache)
		c1, c2 := connect(t, dsn), connect(t, dsn)
		p1, name := backendOf(t, c1)
		p2, _ := backendOf(t, c2)
		if name != db.Name || p1 == p2 {
			t.Fatalf("cache %v: database %q (want %q), backends %d and %d", cache, name, db.Name, p1, p2)
		}
		for range 3 {
			if p, _ := backendOf(t, c1); p != p1 {
				t.Fatalf("cache %v: client moved from backend %d to %d", cache, p1, p)
			}
		}
		if sp, lp := serverPeerPort(t, direct, p1), localPort(c1); sp == lp {
			t.Fatalf("server sees the client's own port %d: not through pgpool", lp)
		}
		ctx := ctxT(t, 30*time.Second)
		if _, err := c1.Exec(ctx, "select pg_advisory_lock(42)"); err != nil {
			t.Fatal(err)
		}
		if err := c1.Close(ctx); err != nil {
			t.Fatal(err)
		}
		for {
			var n int
			if err := direct.QueryRow(ctx, "select count(*) from pg_locks where locktype = 'advisory' and objid = 42 and pid = $1", p1).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("cache %v: backend %d keeps a session lock after its client left", cache, p1)
			case <-time.After(10 * time.Millisecond):
			}
		}
		closeAndCheck(t, p, direct, db.Name)
	}
}

// TestPgpoolTeardown: a Pgpool-II whose test binary is SIGKILLed is
// stopped by its watchdog — every process of its group, its port — like
// the server behind it.
func TestPgpoolTeardown(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short")
	}
	child := teardownChild(t, "sigkill", "PGTEST_DOCKER=0", "PGTEST_CHILD_PGPOOL=1")
	addr, pidText, _ := strings.Cut(child.pgpool, " ")
	pgid, err := strconv.Atoi(pidText)
	if err != nil {
		t.Fatalf("the child reported no Pgpool: %q", child.pgpool)
	}
	waitFor(t, ctxT(t, 2*time.Minute), func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil && syscall.Kill(-pgid, 0) != nil
	}, func() string { return fmt.Sprintf("Pgpool-II's group %d still runs or answers on %s", pgid, addr) })
}

// pgpoolPID returns the pid of the pgpool that listens on addr, read from
// the pid file in its temp dir.
func pgpoolPID(t *testing.T, addr string) int {
	t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "pgtest-pgpool-*"))
	for _, d := range dirs {
		conf, err := os.ReadFile(filepath.Join(d, "pgpool.conf"))
		if err != nil || !strings.Contains(string(conf), "\nport = "+port+"\n") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "pgpool.pid"))
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.Trim(string(b), " \n\x00"))
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	t.Fatalf("no pgpool dir for %s", addr)
	return 0
}
