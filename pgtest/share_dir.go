package pgtest

import (
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

// The shared server's directory sits in a temp dir that other users may
// write to (/dev/shm, /tmp), under a name they can predict. So a binary
// makes it itself (mode 0700), accepts one that is there only if it is
// ours (see checkDir), and opens its files without following symbolic
// links.

// openReaper makes the directory, if it is not there, and opens its
// reaper file for the watchdog. errSpotGone: removed meanwhile.
func (sp shareSpot) openReaper() (*os.File, error) {
	switch err := os.Mkdir(sp.dir, 0o700); {
	case err == nil:
		// Who made it, for sweepShared should its watchdog be killed.
		owner := fmt.Sprintf("%d %s %s\n", sp.parent.pid, sp.parent.start, sp.ns)
		if err := writeInDir(sp.dir, "go", []byte(owner)); err != nil {
			return nil, err
		}
	case !errors.Is(err, fs.ErrExist):
		return nil, err
	}
	if err := sp.checkDir(); err != nil {
		return nil, err
	}
	f, err := openInDir(filepath.Join(sp.dir, "reaper"), os.O_CREATE|os.O_RDWR)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errSpotGone
	}
	return f, err
}

// checkDir refuses a directory that is not ours: a symbolic link, one that
// others may write to, or one owned by another user than this one or, as
// root, the one the server runs as (see unprivilegedUser), which start
// hands it to.
func (sp shareSpot) checkDir() error {
	fi, err := os.Lstat(sp.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return errSpotGone
	}
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok {
		return fmt.Errorf("%s is not a directory", sp.dir)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is writable by other users (mode %v)", sp.dir, fi.Mode().Perm())
	}
	if int(st.Uid) == os.Geteuid() {
		return nil
	}
	if os.Geteuid() == 0 {
		if cred, err := unprivilegedUser(); err == nil && st.Uid == cred.Uid {
			return nil
		}
	}
	return fmt.Errorf("%s belongs to uid %d, not to this user", sp.dir, st.Uid)
}

// openInDir opens path, a file of the shared server's directory, without
// following a symbolic link.
func openInDir(path string, flag int) (*os.File, error) {
	return os.OpenFile(path, flag|syscall.O_NOFOLLOW, 0o600)
}

// writeInDir writes the file name of dir at once: through a temp file of
// its own (O_EXCL, no symbolic link followed) renamed over it.
func writeInDir(dir, name string, data []byte) error {
	tmp := filepath.Join(dir, name+".tmp")
	_ = os.Remove(tmp)
	f, err := openInDir(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	return err
}

// pidNamespace names this process's pid namespace: pids, and so the go
// command's pid in the key, mean something only within one.
func pidNamespace() string {
	ns, _ := os.Readlink("/proc/self/ns/pid")
	return ns
}

// sweepShared removes the shared servers that nobody will remove: their
// watchdog is gone (killed), their go command too, and no binary uses
// them. Every binary that would share does so before it claims its own.
func sweepShared(ns string) {
	dirs, _ := filepath.Glob(filepath.Join(dataParent(), "pgtest-shared-*"))
	for _, dir := range dirs {
		if err := sweepStale(dir, ns); err != nil {
			logf("pgtest: removing the abandoned shared server %s: %v", dir, err)
		}
	}
}

// sweepStale removes the shared server dir if it is ours and stale: its go
// command (of this pid namespace) is gone, or, made before the go file was
// written, it is older than a minute; and its reaper, lock and users locks
// are free. It holds them meanwhile.
func sweepStale(dir, ns string) error {
	sp := shareSpot{dir: dir}
	if sp.checkDir() != nil {
		return nil
	}
	if b, err := os.ReadFile(filepath.Join(dir, "go")); err == nil {
		f := strings.Fields(string(b))
		if len(f) != 3 || f[2] != ns {
			return nil // another namespace's: its pids are not ours to judge
		}
		pid, _ := strconv.Atoi(f[0])
		if st, ok := procStat(pid); ok && st.state != 'Z' && st.state != 'X' && strconv.FormatUint(st.start, 10) == f[1] {
			return nil
		}
	} else if fi, err := os.Lstat(dir); err != nil || time.Since(fi.ModTime()) < time.Minute {
		return nil
	}
	for _, name := range []string{"reaper", "lock", "users"} {
		f, err := openInDir(filepath.Join(dir, name), os.O_CREATE|os.O_RDWR)
		if err != nil {
			return nil // removed meanwhile, or not ours
		}
		defer f.Close()
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			return nil // in use
		}
	}
	l := &local{dir: dir}
	if pid := l.postmaster(); pid != 0 {
		stopDetached(pid, syscall.SIGQUIT)
	}
	return os.RemoveAll(dir)
}
