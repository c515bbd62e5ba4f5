package advisory

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/pgtest"
)

// TestSharedUnlockOnFullTable: one of two shared Locks of a key on one
// session is unlocked while a waiter elsewhere asked to be notified and
// the server's lock table is full. That unlock frees no entry (the other
// reader still holds the key), so a wake-up NOTIFY, whose commit needs an
// entry, would fail the statement (53200) — and the session, with every
// lock on it, used to be closed. The unlock succeeds and every other lock
// stays.
func TestSharedUnlockOnFullTable(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t, pgtest.WithMaxConnections(10),
		pgtest.WithSetting("max_locks_per_transaction", "10"), pgtest.WithSetting("autovacuum", "off"))
	db := srv.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 2 })
	l, w := newLockerT(t, pool), newLockerT(t, pool)
	filler := db.Conn(t)
	other, err := l.TryLock(ctx, pglocks.Int64Key(7))
	if err != nil {
		t.Fatal(err)
	}
	key := pglocks.KeyOf("full-shared-unlock")
	r1, err := l.RLock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l.RLock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _, _ = w.Lock(wctx, key) }()
	for !l.contended(key) {
		if ctx.Err() != nil {
			t.Fatal("the holder never heard the waiter ask")
		}
		<-time.After(time.Millisecond)
	}
	_, err = filler.Exec(ctx, "select count(pg_advisory_lock(k)) from generate_series($1::int8, $1 + 10000000) k", int64(1<<40))
	if err == nil || !strings.Contains(err.Error(), "53200") {
		t.Fatalf("filling the lock table: %v; want 53200", err)
	}
	if err := r1.Unlock(ctx); err != nil {
		t.Errorf("unlocking one of two readers on a full table: %v", err)
	}
	for _, lk := range []*Lock{r2, other} {
		if err := lk.Err(); err != nil {
			t.Errorf("lock %v ended when another was unlocked: %v", lk.Key(), err)
		}
	}
	stop()
	if _, err := filler.Exec(ctx, "select pg_advisory_unlock_all()"); err != nil {
		t.Fatal(err)
	}
}

// newLockerT returns a Locker with one session, closed when t ends.
func newLockerT(t *testing.T, pool *pgxpool.Pool) *Locker {
	l, err := New(pool, Config{MaxSessions: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}
