package pgtest

import "golang.org/x/sys/unix"

// memBacked reports whether dir is on tmpfs or ramfs with at least free
// bytes available.
func memBacked(dir string, free uint64) bool {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return false
	}
	if st.Type != unix.TMPFS_MAGIC && st.Type != unix.RAMFS_MAGIC {
		return false
	}
	return st.Bavail*uint64(st.Bsize) >= free
}
