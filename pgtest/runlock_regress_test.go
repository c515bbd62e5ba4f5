package pgtest_test

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

// lockHolder returns a function giving the pid of a backend that holds
// the run lock of db's run (0 if none).
func lockHolder(t *testing.T, ctx context.Context, admin *pgx.Conn, db string) func() int32 {
	run := strings.Split(db, "_")[1]
	key, _ := strconv.ParseUint(run, 16, 32)
	return func() (pid int32) {
		t.Helper()
		err := admin.QueryRow(ctx, `select coalesce(max(pid), 0) from pg_locks where locktype = 'advisory'
			and classid = x'70677472'::int::oid and objid = $1::int8::oid and objsubid = 2 and granted`, key).Scan(&pid)
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
}

// A lock session whose backend stalls (here stopped) for longer than
// the watchdog's period is slow, not lost: the watchdog keeps the
// session, so the lock stays held and a run starting then drops none of
// the live run's databases.
func TestWatchdogRegressStall(t *testing.T) {
	pgtest.SetRunLockCheckForTest(t, 200*time.Millisecond)
	srv := pgtest.NewServer(t)
	a := runOn(t, srv.DSN())
	defer a.Close()
	db, err := a.CreateDatabase(ctxT(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 2*time.Minute)
	holder := lockHolder(t, ctx, connect(t, srv.DSN()), db.Name)
	pid := holder()
	if pid == 0 {
		t.Fatal("no backend holds the run's lock")
	}
	if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	checks := pgtest.RunLockChecksForTest(a)
	// The fault under test: the backend stays stopped for ten periods.
	time.Sleep(2 * time.Second)
	if err := syscall.Kill(int(pid), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for pgtest.RunLockChecksForTest(a) <= checks+1 && holder() == pid {
		if ctx.Err() != nil {
			t.Fatal("the watchdog never checked again")
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, with a deadline
	}
	if now := holder(); now != pid {
		t.Errorf("after a stall the run's lock is held by %d, not by its session %d: it was freed", now, pid)
	}
	b := runOn(t, srv.DSN())
	defer b.Close()
	if !dbExists(t, srv.DSN(), db.Name) {
		t.Errorf("live run's database %s dropped by a run started after its lock session stalled", db.Name)
	}
	if err := pgtest.RunLockLostForTest(a); err != nil {
		t.Errorf("a stall recorded as a loss: %v", err)
	}
}

// Behind a transaction pooler, the server session holding the run's lock
// may end while statements still run on others: the watchdog looks at
// the lock itself, takes it back, and a direct run then drops none of the
// live run's databases.
func TestWatchdogRegressPooledLockGone(t *testing.T) {
	pgtest.SetRunLockCheckForTest(t, 200*time.Millisecond)
	srv := pgtest.NewServer(t)
	bo := pgtest.NewBouncer(t, srv, pgtest.PoolTransaction, pgtest.BouncerPoolSize(3), pgtest.BouncerRoundRobin())
	dsn, err := bo.DSN(srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	a := runOn(t, dsn+"&default_query_exec_mode=simple_protocol")
	defer a.Close()
	db, err := a.CreateDatabase(ctxT(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 2*time.Minute)
	admin := connect(t, srv.DSN())
	holder := lockHolder(t, ctx, admin, db.Name)
	pid := holder()
	if pid == 0 {
		t.Fatal("no backend holds the run's lock")
	}
	if _, err := admin.Exec(ctx, "select pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(45 * time.Second)
	for now := holder(); now == 0 || now == pid; now = holder() {
		if time.Now().After(deadline) {
			t.Fatal("the run behind a pooler never took its lock back")
		}
		time.Sleep(50 * time.Millisecond) // polling a condition, with a deadline
	}
	b := runOn(t, srv.DSN())
	defer b.Close()
	if !dbExists(t, srv.DSN(), db.Name) {
		t.Errorf("live pooled run's database %s dropped by a direct run", db.Name)
	}
}

// At Close a run drops only the databases it makes, not another whose
// name merely starts like theirs.
func TestSweepRegressCloseDropsOnlyRunNames(t *testing.T) {
	srv := pgtest.NewServer(t)
	a := runOn(t, srv.DSN())
	defer a.Close()
	db, err := a.CreateDatabase(ctxT(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	other := strings.Join(strings.Split(db.Name, "_")[:2], "_") + "_notmade"
	execAll(t, srv.DSN(), "create database "+other)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if dbExists(t, srv.DSN(), db.Name) || !dbExists(t, srv.DSN(), other) {
		t.Errorf("after Close: %s exists: %v (want false), %s exists: %v (want true)",
			db.Name, dbExists(t, srv.DSN(), db.Name), other, dbExists(t, srv.DSN(), other))
	}
}
