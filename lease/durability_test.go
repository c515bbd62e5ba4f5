package lease_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// TestTokensSurviveCrash (review B7): ownership changes commit durably
// whatever the session's synchronous_commit. A private server whose WAL
// writer sleeps 10 s, sessions with synchronous_commit = off, three
// acquisitions (and releases), then a crash — a backend SIGKILLed, so the
// postmaster reinitializes shared memory and recovers from the WAL on disk
// — and the next acquisition's token must be above every token handed out
// before.
func TestTokensSurviveCrash(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t)
	if srv.Mode() != pgtest.ModeLocal {
		t.Skipf("needs a local server to crash (have %s)", srv.Mode())
	}
	ctx := ctxT(t)
	admin := srv.NewDB(t).Conn(t)
	for _, sql := range []string{"alter system set wal_writer_delay = '10s'", "select pg_reload_conf()"} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	_ = admin.Close(ctx)
	db := srv.NewDB(t)
	pool := db.NewPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
		c.MaxConns = 2
	})
	s := newStore(t, pool, lease.Config{})
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var sc string
	if err := pool.QueryRow(ctx, "show synchronous_commit").Scan(&sc); err != nil || sc != "off" {
		t.Fatalf("synchronous_commit %q, %v", sc, err)
	}
	// A checkpoint, so that recovery replays only what follows.
	if _, err := pool.Exec(ctx, "checkpoint"); err != nil {
		t.Fatal(err)
	}
	var last int64
	for range 3 {
		l := mustTry(t, s, "c", time.Minute)
		last = l.Token()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	crash(t, db, pool)
	var l *lease.Lease
	eventually(t, 60*time.Second, "an acquisition after recovery", func() bool {
		var err error
		l, err = s.TryAcquire(ctx, "c", time.Minute)
		return err == nil
	})
	if l.Token() <= last {
		t.Fatalf("token %d after a crash, but %d was handed out before it: handed out twice", l.Token(), last)
	}
	t.Logf("tokens up to %d before the crash, %d after", last, l.Token())
}

// crash SIGKILLs the backend of one of pool's sessions: the postmaster
// then ends every other backend and recovers from the WAL on disk, losing
// what was still in shared memory. It returns once the postmaster has
// ended a witness session opened before, so that no later connection can
// reach the server before its recovery.
func crash(t *testing.T, db *pgtest.DB, pool *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	witness := db.Conn(t)
	var pid int
	if err := pool.QueryRow(ctx, "select pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Skipf("cannot signal the server's backend: %v", err)
	}
	eventually(t, 30*time.Second, "the crash to end the witness session", func() bool {
		_, err := witness.Exec(ctx, "select 1")
		return err != nil
	})
	pool.Reset() // every pooled session died with the crash
}
