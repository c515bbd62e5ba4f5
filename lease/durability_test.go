package lease_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// TestTokensSurviveCrash: acquisitions commit durably whatever
// the session's synchronous_commit. A private server whose WAL
// writer sleeps 10 s, sessions with synchronous_commit = off, three
// acquisitions (and releases), then a crash — a backend SIGKILLed, so the
// postmaster reinitializes shared memory and recovers from the WAL on disk
// — and the next acquisition's token must be above every token handed out
// before.
func TestTokensSurviveCrash(t *testing.T) {
	t.Parallel()
	srv := crashableServer(t)
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
	// A short TTL: a release is not flushed (see TestReleaseLostInCrash),
	// so the crash may leave the last acquisition holding until its expiry.
	var last int64
	for range 3 {
		l := mustTry(t, s, "c", 2*time.Second)
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

// crashableServer starts a private server for a test that crashes it: a
// local one, whose processes the test can signal; it skips otherwise.
func crashableServer(t *testing.T) *pgtest.Server {
	t.Helper()
	srv := pgtest.NewServer(t)
	if srv.Mode() != pgtest.ModeLocal {
		t.Skipf("needs a local server to crash (have %s)", srv.Mode())
	}
	return srv
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
	awaitCrash(t, witness, pool)
}

// awaitCrash returns once the postmaster has ended the witness session,
// opened before a crash began, so that no later connection can reach the
// server before its recovery, and drops pool's sessions, which died too.
func awaitCrash(t *testing.T, witness *pgx.Conn, pool *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eventually(t, 30*time.Second, "the crash to end the witness session", func() bool {
		_, err := witness.Exec(ctx, "select 1")
		return err != nil
	})
	pool.Reset()
}

// stopWriters stops (SIGSTOP) the server's WAL writer and background
// writer, so that only a synchronous commit flushes the WAL, and returns a
// function that SIGKILLs them: a crash. Should the test end before that,
// they are continued at cleanup.
func stopWriters(t *testing.T, pool *pgxpool.Pool) (kill func()) {
	t.Helper()
	rows, _ := pool.Query(ctxT(t), `select pid from pg_stat_activity where backend_type in ('walwriter', 'background writer')`)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil || len(pids) != 2 {
		t.Fatalf("the server's writers: %v, %v", pids, err)
	}
	killed := false
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Skipf("cannot signal the server's writers: %v", err)
		}
		t.Cleanup(func() {
			if !killed { // else the pid may name another process by now
				_ = syscall.Kill(pid, syscall.SIGCONT)
			}
		})
	}
	return func() {
		killed = true
		for _, pid := range pids {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestReleaseLostInCrash: a release does not wait for its WAL flush, and a
// crash that loses it never makes two holders. The server's WAL writer and
// background writer are stopped (SIGSTOP), so that nothing but a
// synchronous commit flushes the WAL; an acquisition and its release are
// acknowledged; then both writers are SIGKILLed, a crash. After recovery
// the row still shows the released acquisition, owner and token, held
// until its expiry (on main, where a release waited for its flush, it was
// free); the next acquisition, after that expiry, gets a higher token.
func TestReleaseLostInCrash(t *testing.T) {
	t.Parallel()
	srv := crashableServer(t)
	ctx := ctxT(t)
	db := srv.NewDB(t)
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 2 })
	s := newStore(t, pool, lease.Config{})
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	killWriters := stopWriters(t, pool)
	witness := db.Conn(t)
	l := mustTry(t, s, "r", 3*time.Second)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	killWriters()
	awaitCrash(t, witness, pool)
	var info lease.Info
	eventually(t, 60*time.Second, "the row after recovery", func() bool {
		var err error
		info, err = s.Get(ctxT(t), "r")
		return err == nil
	})
	switch {
	case info.Token != l.Token():
		t.Fatalf("after the crash the row shows token %d; the released acquisition had %d", info.Token, l.Token())
	case info.Owner == (uuid.UUID{}):
		t.Fatal("the release survived the crash: it waited for its WAL flush")
	case info.Owner != l.Owner():
		t.Fatalf("after the crash the row shows owner %v; the released acquisition was %v's", info.Owner, l.Owner())
	}
	var err error
	var next *lease.Lease
	eventually(t, 60*time.Second, "an acquisition after the lost release's expiry", func() bool {
		next, err = s.TryAcquire(ctxT(t), "r", time.Minute)
		return err == nil
	})
	if next.Token() <= l.Token() {
		t.Fatalf("token %d after the crash, %d before it", next.Token(), l.Token())
	}
	t.Logf("release lost: the row held token %d for %v more; next token %d", l.Token(), info.TimeLeft.Round(time.Millisecond), next.Token())
}
