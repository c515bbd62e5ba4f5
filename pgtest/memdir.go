package pgtest

import (
	"os"
	"path/filepath"
)

// minMemFree is the free space a memory-backed directory must have to hold
// a throwaway cluster: its files (about 40 MB), its WAL and a few hundred
// per-test databases of a small schema (about 8 MB each, dropped as tests
// end).
const minMemFree = 1 << 30

// dataParent returns the directory a throwaway cluster's temp dir is made
// in: PGTEST_TMPDIR when set; else the temp dir (TMPDIR) when it is memory
// backed; else /dev/shm when it is a writable memory-backed file system with
// minMemFree free; else the temp dir. A cluster in memory clones a
// per-test database several times faster than one on disk, and fsync=off
// makes its durability the same (none).
//
// Run as root, the cluster runs as another user (see unprivilegedUser),
// who must reach the dir: a candidate that others cannot search (a private
// TMPDIR made by mktemp -d, mode 0700) is passed over, for /dev/shm or
// /tmp; PGTEST_TMPDIR is taken as given.
func dataParent() string {
	if dir := os.Getenv("PGTEST_TMPDIR"); dir != "" {
		return dir
	}
	tmp := os.TempDir()
	if memBacked(tmp, minMemFree) && reachable(tmp) {
		return tmp
	}
	const shm = "/dev/shm"
	if memBacked(shm, minMemFree) && writable(shm) && reachable(shm) {
		return shm
	}
	if !reachable(tmp) {
		return "/tmp"
	}
	return tmp
}

// reachable reports whether another user can search dir, when that matters
// (we are root).
func reachable(dir string) bool {
	if os.Geteuid() != 0 {
		return true
	}
	fi, err := os.Stat(dir)
	return err == nil && fi.Mode().Perm()&0o001 != 0
}

// writable reports whether a file can be made in dir.
func writable(dir string) bool {
	f, err := os.CreateTemp(dir, ".pgtest-probe-")
	if err != nil {
		return false
	}
	name := f.Name()
	_ = f.Close()
	return os.Remove(filepath.Clean(name)) == nil
}
