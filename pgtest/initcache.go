package pgtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// initdbArgs are initdb's arguments after -D: the same for every throwaway
// cluster, which is what lets one initdb serve them all (see initdbCache).
var initdbArgs = []string{"-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"}

// initdb makes l's cluster: a copy of the cached result of the same initdb
// when there is one (about 50 ms instead of about 1 s) and its pg_control
// is whole, else initdb itself, whose result is then cached for the next
// server (replacing a damaged cache). Every copy has the same
// system identifier, which nothing of a throwaway server depends on.
// PGTEST_INITDB_CACHE=0 turns the cache off.
func (l *local) initdb(ctx context.Context) error {
	data := filepath.Join(l.dir, "data")
	cache := l.initdbCache()
	if cache != "" && copyTree(ctx, filepath.Join(cache, "data"), data) == nil {
		err := l.checkControl(ctx, data)
		if err == nil {
			return nil
		}
		// A damaged cache (pg_control unreadable): an initdb rebuilds it.
		logf("the initdb cache %s is damaged (%v); running initdb and caching it again", cache, err)
		_ = os.RemoveAll(cache)
	}
	_ = os.RemoveAll(data)
	cmd := l.command(ctx, "initdb", append([]string{"-D", data}, initdbArgs...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, strings.TrimSpace(out.String()))
	}
	if cache != "" {
		fillCache(ctx, data, cache)
	}
	return nil
}

// initdbCache returns the directory that holds (or will hold) the cached
// initdb of l's binaries, arguments and user, or "" when there is no cache.
// The key holds the postgres binary's path, size and modification time, so
// that an upgraded PostgreSQL gets a fresh initdb, and the timezone initdb
// writes into postgresql.conf (TZ, else /etc/localtime).
func (l *local) initdbCache() string {
	if os.Getenv("PGTEST_INITDB_CACHE") == "0" {
		return ""
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	bin, err := filepath.EvalSymlinks(filepath.Join(l.bindir, "postgres"))
	if err != nil {
		return ""
	}
	fi, err := os.Stat(bin)
	if err != nil {
		return ""
	}
	uid := os.Geteuid()
	if l.cred != nil {
		uid = int(l.cred.Uid)
	}
	h := sha256.New()
	localtime, _ := filepath.EvalSymlinks("/etc/localtime")
	fmt.Fprintf(h, "%s\x00%d\x00%d\x00%d\x00%s\x00%s\x00%s", bin, fi.Size(), fi.ModTime().UnixNano(), uid,
		strings.Join(initdbArgs, " "), os.Getenv("TZ"), localtime)
	return filepath.Join(base, "pgtest", "initdb-"+hex.EncodeToString(h.Sum(nil))[:16])
}

// fillCache stores a fresh initdb's data dir as cache: copied to a temp dir
// beside it, then renamed, so that a reader sees all of it or none. Any
// failure leaves no cache, which only costs the next server an initdb.
func fillCache(ctx context.Context, data, cache string) {
	parent := filepath.Dir(cache)
	if os.MkdirAll(parent, 0o755) != nil {
		return
	}
	// Fills cut short by a process that died go after ten minutes.
	if old, _ := filepath.Glob(filepath.Join(parent, ".fill-*")); len(old) > 0 {
		for _, dir := range old {
			if fi, err := os.Stat(dir); err == nil && time.Since(fi.ModTime()) > 10*time.Minute {
				_ = os.RemoveAll(dir)
			}
		}
	}
	tmp, err := os.MkdirTemp(parent, ".fill-")
	if err != nil {
		return
	}
	if copyTree(ctx, data, filepath.Join(tmp, "data")) == nil && os.Rename(tmp, cache) == nil {
		return
	}
	_ = os.RemoveAll(tmp) // another process filled it first, or the copy failed
}

// copyTree copies the directory src to dst (which must not exist) with its
// modes and owners, as cp -a does.
func copyTree(ctx context.Context, src, dst string) error {
	if _, err := os.Stat(filepath.Join(src, "PG_VERSION")); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "cp", "-a", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cp -a %s %s: %w: %s", src, dst, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// checkControl checks that data's pg_control is whole: 8 kB, and read
// without error by pg_controldata when it sits beside postgres (initdb and
// postgres may be links into a bin directory that has no pg_controldata).
func (l *local) checkControl(ctx context.Context, data string) error {
	fi, err := os.Stat(filepath.Join(data, "global", "pg_control"))
	if err != nil {
		return err
	}
	if fi.Size() != 8192 {
		return fmt.Errorf("global/pg_control has %d bytes", fi.Size())
	}
	bin, err := filepath.EvalSymlinks(filepath.Join(l.bindir, "postgres"))
	if err != nil {
		return nil
	}
	tool := filepath.Join(filepath.Dir(bin), "pg_controldata")
	if _, err := os.Stat(tool); err != nil {
		return nil
	}
	cmd := l.command(ctx, "pg_controldata", "-D", data)
	cmd.Path, cmd.Args[0], cmd.Err = tool, tool, nil
	out, err := cmd.CombinedOutput()
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if err != nil {
		return fmt.Errorf("pg_controldata: %w: %s", err, line)
	}
	if strings.Contains(string(out), "WARNING") { // a CRC mismatch: it exits 0
		return fmt.Errorf("pg_controldata: %s", line)
	}
	return nil
}
