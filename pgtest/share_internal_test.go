package pgtest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestShareStartCutShort: a test binary SIGKILLed while it starts the
// shared server (its locks gone with it, its postmaster running, no port
// written) leaves nothing that lasts. The next binary stops that
// postmaster and starts the server anew; the watchdog removes the server
// once the go command — here a sleep standing in for it — is gone and no
// binary uses the server.
func TestShareStartCutShort(t *testing.T) {
	t.Parallel()
	skipUnlessShareInternal(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	spot, goCmd, cfg, bindir := fakeGoSpot(t)
	stale := cutShortStart(t, ctx, spot, cfg, bindir)

	b, err := spot.claim(ctx, cfg, bindir)
	if err != nil {
		t.Fatal(err)
	}
	if !b.started || b.l.port == 0 {
		t.Fatalf("the next binary did not start the server anew (started %v, port %d)", b.started, b.l.port)
	}
	if processAlive(stale) {
		t.Fatalf("the half-started postmaster %d still runs", stale)
	}
	conn, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:"+strconv.Itoa(b.l.port)+"/postgres?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)
	postmaster := b.l.postmaster()
	if err := b.close(); err != nil {
		t.Fatal(err)
	}
	_ = goCmd.Process.Kill()
	_ = goCmd.Wait()
	waitSpotGone(t, ctx, spot, postmaster)
}

// cutShortStart does what a binary SIGKILLed while starting the shared
// server at spot leaves: its locks gone, its postmaster running, no port
// file. It returns that postmaster's pid.
func cutShortStart(t *testing.T, ctx context.Context, spot shareSpot, cfg config, bindir string) int {
	t.Helper()
	b, err := spot.claim(ctx, cfg, bindir)
	if err != nil {
		t.Fatal(err)
	}
	if !b.started {
		t.Fatal("the first binary found a server")
	}
	if err := os.Remove(filepath.Join(spot.dir, "port")); err != nil {
		t.Fatal(err)
	}
	pid := b.l.postmaster()
	if pid == 0 {
		t.Fatal("no postmaster runs")
	}
	_ = b.users.Close() // its death frees its users lock
	return pid
}

func skipUnlessShareInternal(t *testing.T) {
	t.Helper()
	switch _, err := exec.LookPath("flock"); {
	case testing.Short():
		t.Skip("-short")
	case os.Getenv("PGTEST_DSN") != "":
		t.Skip("PGTEST_DSN: the shared server is local mode's")
	case err != nil:
		t.Skip("no flock command")
	}
}

// fakeGoSpot returns a shared server spot, in the temp dir, of a sleep
// standing in for the go command, which the caller may kill; and the
// config and binaries to claim it with.
func fakeGoSpot(t *testing.T) (shareSpot, *exec.Cmd, config, string) {
	t.Helper()
	goCmd := exec.Command("sleep", "3600")
	if err := goCmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = goCmd.Process.Kill(); _ = goCmd.Wait() })
	st, ok := procStat(goCmd.Process.Pid)
	if !ok {
		t.Fatal("no /proc stat for the sleep")
	}
	spot := shareSpot{dir: filepath.Join(dataParent(), "pgtest-shared-test"+randomHex(4)),
		parent: procID{pid: goCmd.Process.Pid, start: strconv.FormatUint(st.start, 10)}, ns: pidNamespace()}
	bindir, err := findBinDir()
	if err != nil {
		t.Fatal(err)
	}
	return spot, goCmd, newConfig([]Option{WithoutDocker()}), bindir
}

// waitSpotGone waits until the shared server at spot, postmaster and
// directory, is gone.
func waitSpotGone(t *testing.T, ctx context.Context, spot shareSpot, postmaster int) {
	t.Helper()
	for delay := time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		_, err := os.Stat(spot.dir)
		if errors.Is(err, os.ErrNotExist) && !processAlive(postmaster) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the server (postmaster %d, %s) is still there: %v", postmaster, spot.dir, ctx.Err())
		case <-time.After(delay):
		}
	}
}
