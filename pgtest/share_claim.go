package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// errSpotGone: the shared server's directory was removed, or lost its
// watchdog, while this process waited for its lock: look again.
var errSpotGone = errors.New("the shared server's directory went away meanwhile")

// errShareBusy: another binary held the shared server's directory lock for
// shareLockWait; this binary starts a server of its own instead.
var errShareBusy = errors.New("gave up waiting for the shared server")

// shareLockWait bounds the wait for the directory's lock, which a binary
// holds while it starts the server (seconds, even on a loaded machine).
const shareLockWait = time.Minute

// claim finds the shared server at sp, or starts it, under the
// directory's lock, and takes this binary's hold on it (the users lock).
func (sp shareSpot) claim(ctx context.Context, cfg config, bindir string) (*sharedBackend, error) {
	for attempt := 0; ; attempt++ {
		lock, err := sp.lock(ctx)
		if errors.Is(err, errSpotGone) && attempt < 10 {
			continue
		}
		if err != nil {
			return nil, err
		}
		b, err := sp.claimLocked(ctx, cfg, bindir)
		_ = lock.Close() // unlocks
		return b, err
	}
}

// lock makes sure that the directory has its watchdog, then takes the
// directory's lock: on the file that is there, while a watchdog is.
func (sp shareSpot) lock(ctx context.Context) (*os.File, error) {
	if err := sp.ensureReaper(); err != nil {
		return nil, err
	}
	if err := sp.checkDir(); err != nil {
		return nil, err
	}
	path := filepath.Join(sp.dir, "lock")
	f, err := openInDir(path, os.O_CREATE|os.O_RDWR)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errSpotGone
	}
	if err != nil {
		return nil, err
	}
	wait := sp.lockWait
	if wait == 0 {
		wait = shareLockWait
	}
	wctx, cancel := context.WithTimeoutCause(ctx, wait, errShareBusy)
	defer cancel()
	if err := flockWait(wctx, f, syscall.LOCK_EX); err != nil {
		_ = f.Close()
		if errors.Is(err, errShareBusy) {
			return nil, fmt.Errorf("another test binary has held %s for %v (starting the server, or hung): %w",
				path, wait, err)
		}
		return nil, fmt.Errorf("lock: %w", err)
	}
	fi, ferr := f.Stat()
	pi, perr := os.Stat(path)
	if ferr != nil || perr != nil || !os.SameFile(fi, pi) || !sp.reaperAlive() {
		_ = f.Close()
		return nil, errSpotGone
	}
	return f, nil
}

// reaperAlive reports whether a watchdog holds the directory's reaper
// lock.
func (sp shareSpot) reaperAlive() bool {
	f, err := openInDir(filepath.Join(sp.dir, "reaper"), os.O_RDONLY)
	if err != nil {
		return false
	}
	defer f.Close()
	return errors.Is(syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB), syscall.EWOULDBLOCK)
}

// flockWait takes the flock how on f, waiting for it until ctx ends.
func flockWait(ctx context.Context, f *os.File, how int) error {
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return err
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(delay):
		}
	}
}

// claimLocked, under the directory's lock, takes this binary's users
// lock and finds the running server, or starts it.
func (sp shareSpot) claimLocked(ctx context.Context, cfg config, bindir string) (*sharedBackend, error) {
	users, err := openInDir(filepath.Join(sp.dir, "users"), os.O_CREATE|os.O_RDWR)
	if err != nil {
		return nil, err
	}
	// Never blocks: the watchdog takes users exclusively only under the
	// directory's lock, which this process holds.
	if err := syscall.Flock(int(users.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		_ = users.Close()
		return nil, fmt.Errorf("users lock: %w", err)
	}
	l := &local{bindir: bindir, dir: sp.dir, detached: true}
	if os.Geteuid() == 0 {
		if l.cred, err = unprivilegedUser(); err != nil {
			_ = users.Close()
			return nil, err
		}
	}
	b := &sharedBackend{l: l, spot: sp, users: users}
	if port, ok := sp.running(l); ok {
		l.port = port
		return b, nil
	}
	if err := sp.start(ctx, l, cfg); err != nil {
		_ = users.Close()
		return nil, err
	}
	b.started = true
	return b, nil
}

// running returns the port of the server in the directory, if one was
// started there and its postmaster runs.
func (sp shareSpot) running(l *local) (int, bool) {
	b, err := os.ReadFile(filepath.Join(sp.dir, "port"))
	if err != nil {
		return 0, false
	}
	port, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return port, err == nil && l.postmaster() != 0
}

// postmaster returns the pid of the postmaster running on l's data
// directory, or 0.
func (l *local) postmaster() int {
	data := filepath.Join(l.dir, "data")
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || !processAlive(pid) {
		return 0
	}
	// The pid may be another process's by now, should the postmaster have
	// died without removing its file.
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || !bytes.Contains(cmdline, []byte(data)) {
		return 0
	}
	return pid
}

// start starts the shared server in the directory, after removing what a
// binary that died while starting one left, or one that has died. The
// port file, written last, says that it runs.
func (sp shareSpot) start(ctx context.Context, l *local, cfg config) error {
	_ = os.Remove(filepath.Join(sp.dir, "port"))
	if pid := l.postmaster(); pid != 0 {
		stopDetached(pid, syscall.SIGQUIT)
	}
	for _, name := range []string{"data", "postgres.log"} {
		if err := os.RemoveAll(filepath.Join(sp.dir, name)); err != nil {
			return err
		}
	}
	if l.cred != nil {
		if err := os.Chown(sp.dir, int(l.cred.Uid), int(l.cred.Gid)); err != nil {
			return err
		}
	}
	if err := l.initdb(ctx); err != nil {
		return err
	}
	if err := l.allowPartitionSubnet(); err != nil {
		return err
	}
	l.args = l.baseArgs(cfg)
	if err := l.startOnFreePort(ctx); err != nil {
		return err
	}
	err := writeInDir(sp.dir, "port", []byte(strconv.Itoa(l.port)+"\n"))
	if err != nil {
		l.stop(syscall.SIGQUIT)
	}
	return err
}
