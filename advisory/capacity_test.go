package advisory_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// fillBase is the first key of the filler's locks, far from the test's.
const fillBase = 1 << 40

// TestLockTableFull fills the server's shared lock table — on a server
// with the smallest max_locks_per_transaction (10), few connections and no
// autovacuum to take entries meanwhile — with a plain SQL client's locks,
// while a Locker holds a few. Then every way of taking a lock fails with
// ErrLockTableFull, Lock at once; the Locker's session and its locks
// survive; and once the filler frees some entries the same session takes
// the key that failed, and nothing is left behind.
func TestLockTableFull(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t, pgtest.WithMaxConnections(10),
		pgtest.WithSetting("max_locks_per_transaction", "10"), pgtest.WithSetting("autovacuum", "off"))
	db := srv.NewDB(t)
	ctx := ctxT(t)
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 2 })
	l := newLocker(t, pool, advisory.Config{MaxSessions: 1})
	// Connections opened before the table fills: opening one needs an entry.
	filler, conn := db.Conn(t), db.Conn(t)
	var held []*advisory.Lock
	for i := range int64(3) {
		lk, err := l.TryLock(ctx, pglocks.Int64Key(i))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, lk)
	}

	n := fillLockTable(ctx, t, filler)
	t.Logf("the lock table was full after the filler took %d locks", n)
	key := pglocks.KeyOf("capacity-full")
	_, err := l.TryLock(ctx, key)
	if !errors.Is(err, advisory.ErrLockTableFull) || errors.Is(err, advisory.ErrLocked) {
		t.Fatalf("TryLock on a full lock table: %v; want ErrLockTableFull", err)
	}
	if !strings.Contains(err.Error(), "max_locks_per_transaction") || !strings.Contains(err.Error(), key.String()) {
		t.Errorf("error %q names neither the setting nor the key", err)
	}
	acquireFull(ctx, t, l, key)
	// A Locker with no session yet fails to dial one, for the same reason.
	acquireFull(ctx, t, newLocker(t, pool, advisory.Config{}), key)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := advisory.XactLock(ctx, tx, key); !errors.Is(err, advisory.ErrLockTableFull) {
		t.Errorf("XactLock on a full lock table: %v; want ErrLockTableFull", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// The session and every lock on it survived.
	for _, lk := range held {
		if err := lk.Err(); err != nil {
			t.Fatalf("lock %v ended: %v", lk.Key(), err)
		}
	}
	// Unlocking frees capacity: the key that failed is taken on the same
	// session.
	if _, err := filler.Exec(ctx, "select pg_advisory_unlock(k) from generate_series($1::int8, $1 + 99) k", int64(fillBase)); err != nil {
		t.Fatal(err)
	}
	lk, err := l.TryLock(ctx, key)
	if err != nil {
		t.Fatalf("TryLock after the filler freed entries: %v", err)
	}
	if lk.PID() != held[0].PID() {
		t.Errorf("TryLock took the key on session %d; the Locker's locks are on %d", lk.PID(), held[0].PID())
	}
	if _, err := filler.Exec(ctx, "select pg_advisory_unlock_all()"); err != nil {
		t.Fatal(err)
	}
	for _, lk := range append(held, lk) {
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Nothing leaked: no advisory lock is left on the server.
	var left int
	if err := conn.QueryRow(ctx, "select count(*) from pg_locks where locktype = 'advisory'").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d advisory locks left on the server after every unlock", left)
	}
}

// fillLockTable takes session locks on conn until the server's lock table
// is full, and returns how many it took. A session lock outlives the
// statement that failed, so the locks taken before the error stay.
func fillLockTable(ctx context.Context, t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	_, err := conn.Exec(ctx, "select count(pg_advisory_lock(k)) from generate_series($1::int8, $1 + 10000000) k", int64(fillBase))
	if !strings.Contains(err.Error(), "SQLSTATE 53200") {
		t.Fatalf("filling the lock table: %v; want out of shared memory (53200)", err)
	}
	var n int
	if err := conn.QueryRow(ctx, "select count(*) from pg_locks where locktype = 'advisory' and pid = pg_backend_pid()").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// acquireFull checks that every way of taking key on l fails with
// ErrLockTableFull on a full table: the waiting ones at once.
func acquireFull(ctx context.Context, t *testing.T, l *advisory.Locker, key pglocks.Key) {
	t.Helper()
	for name, take := range map[string]func(context.Context, pglocks.Key) (*advisory.Lock, error){
		"TryLock": l.TryLock, "Lock": l.Lock, "RLock": l.RLock, "TryRLock": l.TryRLock,
	} {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		lk, err := take(wctx, key)
		cancel()
		if lk != nil || !errors.Is(err, advisory.ErrLockTableFull) || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s on a full lock table: %v, %v; want ErrLockTableFull at once", name, lk, err)
		}
	}
}
