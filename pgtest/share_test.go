package pgtest_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"
)

// TestShareGoTest proves the local server shared by the test binaries of
// one go test, with real go test runs over a module of three packages
// (-p 3: their binaries start at once), each migrating through a counting
// Migrator and reporting what the server says of itself:
//
//   - OneServer: one postmaster (pid, port, start time) served them all, the
//     migrations ran once, the others cloned that template, and once go
//     test has exited the server's processes and directory are gone.
//   - KillBinary: one binary SIGKILLed while the others wait: they go on
//     on the same server afterwards; it is removed once they have exited.
//   - KillGo: the go command SIGKILLed while its binaries wait: the
//     watchdog sees it gone, leaves the server to the binaries that still
//     use it, and removes it once they have exited.
func TestShareGoTest(t *testing.T) {
	t.Parallel()
	skipUnlessShare(t)
	mod := shareModule(t, 3)
	all := []string{"p0", "p1", "p2"}
	t.Run("OneServer", func(t *testing.T) {
		t.Parallel()
		ctx := ctxT(t, 5*time.Minute)
		g := startGoTest(t, mod, nil, []string{"-p", "3"})
		if err := g.wait(ctx); err != nil {
			t.Fatalf("go test: %v\n%s", err, g.out.String())
		}
		reports := g.waitReports(ctx, "before", 3)
		postmaster, dir := oneServer(t, reports)
		if n := g.migrations(); n != 1 {
			t.Fatalf("the migrations ran %d times, want once for the three binaries", n)
		}
		firstDBs(t, reports)
		waitServerGone(t, ctx, postmaster, dir)
	})
	t.Run("KillBinary", func(t *testing.T) {
		t.Parallel()
		ctx := ctxT(t, 5*time.Minute)
		g := startGoTest(t, mod, all, []string{"-p", "3"})
		before := g.waitReports(ctx, "before", 3)
		victim := before[slices.IndexFunc(before, func(r shareReport) bool { return r.pkg == "p2" })]
		if err := syscall.Kill(victim.pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		g.release(ctx, "p0")
		g.release(ctx, "p1")
		if err := g.wait(ctx); err == nil {
			t.Fatalf("go test passed; p2 was killed:\n%s", g.out.String())
		}
		after := g.waitReports(ctx, "after", 2)
		postmaster, dir := oneServer(t, append(before, after...))
		waitServerGone(t, ctx, postmaster, dir)
	})
	t.Run("KillGo", func(t *testing.T) {
		t.Parallel()
		ctx := ctxT(t, 5*time.Minute)
		g := startGoTest(t, mod, all, []string{"-p", "3"})
		before := g.waitReports(ctx, "before", 3)
		postmaster, dir := oneServer(t, before)
		_ = g.cmd.Process.Kill()
		_ = g.wait(ctx)
		watchdogSawGoGone(t, ctx, dir)
		if _, err := os.Stat(dir); err != nil || !anyAlive([]int{postmaster}) {
			t.Fatalf("the watchdog removed the server while its binaries used it: %v", err)
		}
		for _, pkg := range all {
			g.release(ctx, pkg)
		}
		after := g.waitReports(ctx, "after", 3)
		oneServer(t, append(before, after...))
		waitServerGone(t, ctx, postmaster, dir)
	})
}

func skipUnlessShare(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: runs go test")
	}
	if os.Getenv("PGTEST_DSN") != "" {
		t.Skip("PGTEST_DSN: the shared server is local mode's")
	}
	if runtime.GOOS != "linux" {
		t.Skip("the shared server is Linux's")
	}
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("no flock command: servers are not shared")
	}
}

// watchdogSawGoGone waits until the watchdog of the shared server dir has
// seen the go command gone and tried to remove the server, and returns
// once it has backed off (or exited). It holds the directory's lock
// meanwhile, so that the watchdog's try waits, with users open, in a state
// this can see: a process of the watchdog (its environment names dir)
// with dir/users open.
func watchdogSawGoGone(t *testing.T, ctx context.Context, dir string) {
	t.Helper()
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	users := filepath.Join(dir, "users")
	waitFor(t, ctx, func() bool { return watchdogHas(dir, users) }, func() string {
		return "the watchdog never tried to remove the server after the go command's death"
	})
	_ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	waitFor(t, ctx, func() bool { return !watchdogHas(dir, users) }, func() string {
		return "the watchdog still holds the users file"
	})
}

// watchdogHas reports whether a process of the watchdog of dir has the
// file path open.
func watchdogHas(dir, path string) bool {
	envs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, env := range envs {
		b, err := os.ReadFile(env)
		if err != nil || !bytes.Contains(b, []byte("\x00PGTEST_REAP_DIR="+dir+"\x00")) {
			continue
		}
		fds, _ := filepath.Glob(filepath.Join(filepath.Dir(env), "fd", "*"))
		for _, fd := range fds {
			if target, err := os.Readlink(fd); err == nil && target == path {
				return true
			}
		}
	}
	return false
}

// TestShareGoTestMany measures a 20-package module's go test with the
// shared server and with PGTEST_SHARE=0: servers started and wall time.
// Opt-in: PGTEST_SHARE_MANY=1 (it builds 20 test binaries).
func TestShareGoTestMany(t *testing.T) {
	if os.Getenv("PGTEST_SHARE_MANY") == "" {
		t.Skip("PGTEST_SHARE_MANY=1 runs a 20-package module's go test, shared and not")
	}
	skipUnlessShare(t)
	const n = 20
	mod := shareModule(t, n)
	ctx := ctxT(t, 20*time.Minute)
	run := func(env ...string) (time.Duration, []shareReport) {
		g := startGoTest(t, mod, nil, nil, env...)
		begin := time.Now()
		if err := g.wait(ctx); err != nil {
			t.Fatalf("go test: %v\n%s", err, g.out.String())
		}
		return time.Since(begin), g.waitReports(ctx, "before", n)
	}
	run() // builds the binaries: the timed runs only link and run them
	for round := range 2 {
		for _, share := range []string{"1", "0"} {
			took, reports := run("PGTEST_SHARE=" + share)
			servers := map[int]bool{}
			var firsts []time.Duration
			for _, r := range reports {
				servers[r.postmaster] = true
				firsts = append(firsts, time.Duration(r.firstMicro)*time.Microsecond)
			}
			slices.Sort(firsts)
			t.Logf("round %d, PGTEST_SHARE=%s: %d packages, %d servers started, go test %v; first database after a binary's start: min %v, p50 %v, max %v",
				round+1, share, n, len(servers), took.Round(10*time.Millisecond), firsts[0].Round(time.Millisecond),
				firsts[len(firsts)/2].Round(time.Millisecond), firsts[len(firsts)-1].Round(time.Millisecond))
			if want := map[string]int{"1": 1, "0": n}[share]; len(servers) != want {
				t.Errorf("PGTEST_SHARE=%s: %d servers, want %d", share, len(servers), want)
			}
		}
	}
}
