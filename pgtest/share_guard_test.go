package pgtest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestShareWatchdogKilled: a shared server whose watchdog was SIGKILLed
// does not outlive its go command.
//
//   - BinaryCloses: the binary that uses it notices, on its close, and
//     starts another watchdog, which removes the server once go is gone.
//   - BinaryKilled: the binary dies too; the next binary that would share
//     (sweepShared) removes the server, whose go command, watchdog and
//     binaries are gone.
func TestShareWatchdogKilled(t *testing.T) {
	t.Parallel()
	skipUnlessShareInternal(t)
	for _, binaryCloses := range []bool{true, false} {
		t.Run(map[bool]string{true: "BinaryCloses", false: "BinaryKilled"}[binaryCloses], func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			spot, goCmd, cfg, bindir := fakeGoSpot(t)
			b, err := spot.claim(ctx, cfg, bindir)
			if err != nil {
				t.Fatal(err)
			}
			postmaster := b.l.postmaster()
			killWatchdog(t, ctx, spot.dir)
			if binaryCloses {
				if err := b.close(); err != nil {
					t.Fatal(err)
				}
			} else {
				_ = b.users.Close() // its death frees its users lock
			}
			_ = goCmd.Process.Kill()
			_ = goCmd.Wait()
			if !binaryCloses {
				sweepShared(spot.ns)
			}
			waitSpotGone(t, ctx, spot, postmaster)
		})
	}
}

// killWatchdog SIGKILLs the processes of the watchdog of the shared server
// dir (their environment names dir: the shell and its sleep) until none is
// left, and its reaper lock is free.
func killWatchdog(t *testing.T, ctx context.Context, dir string) {
	t.Helper()
	spot := shareSpot{dir: dir}
	if !spot.reaperAlive() {
		t.Fatalf("no watchdog holds %s/reaper", dir)
	}
	for {
		found := false
		envs, _ := filepath.Glob("/proc/[0-9]*/environ")
		for _, env := range envs {
			b, err := os.ReadFile(env)
			if err != nil || !bytes.Contains(b, []byte("\x00PGTEST_REAP_DIR="+dir+"\x00")) {
				continue
			}
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(env)))
			if processAlive(pid) { // a zombie holds no lock
				_ = syscall.Kill(pid, syscall.SIGKILL)
				found = true
			}
		}
		if !found && !spot.reaperAlive() {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the watchdog of %s outlived SIGKILL", dir)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestShareDirNotOurs: a directory at the shared server's (predictable)
// name that another user made, or that others may write to, is refused
// before anything is written in it: a symbolic link planted there does not
// make this binary (root, here) write through it, and the error says why.
func TestShareDirNotOurs(t *testing.T) {
	t.Parallel()
	skipUnlessShareInternal(t)
	t.Run("WorldWritable", func(t *testing.T) {
		t.Parallel()
		plantedDir(t, 0o777, "writable by other users")
	})
	t.Run("OtherUser", func(t *testing.T) {
		t.Parallel()
		if os.Geteuid() != 0 {
			t.Skip("only root can make a directory another user's")
		}
		plantedDir(t, 0o700, "belongs to uid 65534")
	})
}

// plantedDir makes the directory of a shared server spot, mode perm (as
// the nobody user, when root), with symbolic links to a victim file at the
// names of the files a binary writes there; a claim must fail with an
// error saying want, and leave the victim as it was.
func plantedDir(t *testing.T, perm os.FileMode, want string) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	spot, _, cfg, bindir := fakeGoSpot(t)
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(spot.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(spot.dir) })
	if err := os.Chmod(spot.dir, perm); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"port.tmp", "go.tmp"} {
		if err := os.Symlink(victim, filepath.Join(spot.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if os.Geteuid() == 0 {
		_ = filepath.Walk(spot.dir, func(path string, _ os.FileInfo, _ error) error { return os.Lchown(path, 65534, 65534) })
	}
	b, err := spot.claim(ctx, cfg, bindir)
	if err == nil {
		_ = b.close()
	}
	if got, _ := os.ReadFile(victim); string(got) != "precious\n" {
		t.Fatalf("the file a planted symbolic link names was written: %q", got)
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("claim: %v, want an error saying %q", err, want)
	}
}

// TestShareLockBusy: a binary that holds the shared server's lock (hung)
// makes the others give up on sharing after a bounded wait, not time out.
func TestShareLockBusy(t *testing.T) {
	t.Parallel()
	skipUnlessShareInternal(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	spot, _, cfg, bindir := fakeGoSpot(t)
	if err := spot.ensureReaper(); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(spot.dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	spot.lockWait = time.Second
	b, err := spot.claim(ctx, cfg, bindir)
	if err == nil {
		_ = b.close()
		t.Fatal("claimed the server while another binary held its lock")
	}
	if !errors.Is(err, errShareBusy) || ctx.Err() != nil {
		t.Fatalf("err %v, want errShareBusy before the start's deadline", err)
	}
}

// TestShareKeyNamespace: go commands of the same pid and start time in two
// pid namespaces (containers sharing a temp dir) do not share a server.
func TestShareKeyNamespace(t *testing.T) {
	t.Parallel()
	cfg := newConfig(nil)
	parent := procID{pid: 100, start: "4242"}
	if shareKey(parent, "pid:[1]", "/bin", 0, cfg) == shareKey(parent, "pid:[2]", "/bin", 0, cfg) {
		t.Fatal("one key for two pid namespaces")
	}
}
