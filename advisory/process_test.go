package advisory_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// The environment of the helper process started by startHolder.
const (
	helperEnv    = "PGLOCKS_ADVISORY_HELPER_DSN"
	helperKeyEnv = "PGLOCKS_ADVISORY_HELPER_KEY"
)

// TestHelperProcess is not a test: run by startHolder in a child process,
// it takes a lock, says "locked" on stdout and holds it until killed.
func TestHelperProcess(t *testing.T) {
	dsn := os.Getenv(helperEnv)
	if dsn == "" {
		t.Skip("helper process for the cross-process tests")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	l, err := advisory.New(pool, advisory.Config{ApplicationName: "pglocks-helper"})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	lk, err := l.Lock(ctx, pglocks.KeyOf(os.Getenv(helperKeyEnv)))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	fmt.Printf("locked %d\n", lk.PID())
	select {} // hold until killed
}

// startHolder starts a child process (this test binary) that holds key on
// the database dsn, and returns once it holds it.
func startHolder(t *testing.T, dsn, key string) (*exec.Cmd, uint32) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.v=false")
	cmd.Env = append(os.Environ(), helperEnv+"="+dsn, helperKeyEnv+"="+key)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("helper process: %v (output %q)", err, line)
	}
	var pid uint32
	if _, err := fmt.Sscanf(line, "locked %d", &pid); err != nil {
		t.Fatalf("helper process said %q", strings.TrimSpace(line))
	}
	return cmd, pid
}

func TestCrossProcess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)

	// Each case frees the child's lock a different way; a waiter in this
	// process must then hold it within a second.
	cases := []struct {
		name  string
		proxy bool // the child connects through a proxy
		free  func(t *testing.T, cmd *exec.Cmd, pid uint32, p *pgtest.Proxy)
	}{
		{"SIGKILL", false, func(t *testing.T, cmd *exec.Cmd, _ uint32, _ *pgtest.Proxy) {
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}},
		{"TerminateBackend", false, func(t *testing.T, _ *exec.Cmd, pid uint32, _ *pgtest.Proxy) {
			if err := b.db.Server.TerminateBackend(ctx, pid); err != nil {
				t.Fatal(err)
			}
		}},
		{"ProxyReset", true, func(t *testing.T, _ *exec.Cmd, _ uint32, p *pgtest.Proxy) {
			if p.Reset() == 0 {
				t.Fatal("no connection to reset")
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key := "cross-process-" + c.name
			dsn := b.db.DSN
			var p *pgtest.Proxy
			if c.proxy {
				p, dsn = b.db.Proxy(t)
			}
			cmd, pid := startHolder(t, dsn, key)
			if _, err := b.locker.TryLock(ctx, pglocks.KeyOf(key)); err == nil {
				t.Fatal("TryLock succeeded while the child holds the key")
			}
			got := make(chan time.Time, 1)
			go func() {
				lk, err := b.locker.Lock(ctx, pglocks.KeyOf(key))
				if err != nil {
					t.Error(err)
					close(got)
					return
				}
				got <- time.Now()
				_ = lk.Unlock(ctx)
			}()
			start := time.Now()
			c.free(t, cmd, pid, p)
			at, ok := <-got
			if !ok {
				t.FailNow()
			}
			took := at.Sub(start)
			t.Logf("%s: the waiter held the lock %v after the holder was %s", c.name, took.Round(time.Microsecond), c.name)
			if took > time.Second {
				t.Errorf("takeover took %v, want ≤ 1s", took)
			}
		})
	}
}
