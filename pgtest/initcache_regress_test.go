package pgtest_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks/pgtest"
)

// A corrupt initdb cache costs one initdb, and is rebuilt: it never fails
// a start.
func TestInitdbCacheRegressCorrupt(t *testing.T) {
	if os.Getenv("PGTEST_DSN") != "" {
		t.Skip("no throwaway servers with PGTEST_DSN")
	}
	cache := t.TempDir()
	_ = os.Chmod(cache, 0o755)
	t.Setenv("XDG_CACHE_HOME", cache)
	pgtest.NewServer(t) // fills the cache
	dirs, _ := filepath.Glob(filepath.Join(cache, "pgtest", "initdb-*", "data"))
	if len(dirs) != 1 {
		t.Fatalf("cache: %v", dirs)
	}
	if err := os.Remove(filepath.Join(dirs[0], "global", "pg_control")); err != nil {
		t.Fatal(err)
	}
	s, err := pgtest.Start(ctxT(t, 2*time.Minute))
	if err != nil {
		t.Fatalf("a corrupt cache fails a start: %v", err)
	}
	_ = s.Close()
	if _, err := os.Stat(filepath.Join(dirs[0], "global", "pg_control")); err != nil {
		t.Errorf("the corrupt cache was not rebuilt: %v", err)
	}
}

// The cache is keyed by TZ, which initdb writes into postgresql.conf.
func TestInitdbCacheRegressTimezone(t *testing.T) {
	if os.Getenv("PGTEST_DSN") != "" {
		t.Skip("no throwaway servers with PGTEST_DSN")
	}
	cache := t.TempDir()
	_ = os.Chmod(cache, 0o755)
	t.Setenv("XDG_CACHE_HOME", cache)
	t.Setenv("TZ", "America/New_York")
	pgtest.NewServer(t)
	t.Setenv("TZ", "Asia/Tokyo")
	s := pgtest.NewServer(t)
	conn := connect(t, s.DSN())
	var tz string
	if err := conn.QueryRow(ctxT(t, 30*time.Second), "show timezone").Scan(&tz); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tz, "Tokyo") {
		t.Fatalf("server timezone %s, want Asia/Tokyo as initdb without the cache gives", tz)
	}
}
