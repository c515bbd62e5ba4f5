//go:build !linux

package pgtest

// memBacked reports false: outside Linux, pgtest does not look for memory
// file systems (set PGTEST_TMPDIR to use one).
func memBacked(dir string, free uint64) bool { return false }
