package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestReleaseNotifiesOnlyWaiters: a release with nobody waiting sends no
// NOTIFY (which would serialize commits cluster-wide); with a waiter, it
// does. A sentinel NOTIFY sent after the release shows which came first.
func TestReleaseNotifiesOnlyWaiters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	spy := b.db.Conn(t)
	if _, err := spy.Exec(ctx, "listen pglocks_leases"); err != nil {
		t.Fatal(err)
	}
	next := func() string {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := spy.WaitForNotification(wctx)
		if err != nil {
			t.Fatal(err)
		}
		return n.Payload
	}

	l := mustTry(t, b.store, "quiet", time.Hour)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	exec(t, b.pool, "select pg_notify('pglocks_leases', 'sentinel')")
	if got := next(); got != "sentinel" {
		t.Fatalf("first notification %q: a release without waiters notified", got)
	}

	l = mustTry(t, b.store, "busy", time.Hour)
	done := make(chan error, 1)
	go func() {
		w, err := b.store.Acquire(ctx, "busy", time.Minute)
		if err == nil {
			err = w.Release(ctx)
		}
		done <- err
	}()
	waitParked(t, b.store)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "rbusy" {
		t.Fatalf("notification %q, want rbusy (released: busy)", got)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestAdvisoryBehaviour pins the PostgreSQL behaviour the interest protocol
// relies on: an exclusive transaction-scoped try fails while another
// session holds the key shared, and a shared request waits for an
// exclusive transaction lock until that transaction ends.
func TestAdvisoryBehaviour(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	a, c := b.db.Conn(t), b.db.Conn(t)
	const key = 4242
	var ok bool
	if _, err := a.Exec(ctx, "select pg_advisory_lock_shared($1)", key); err != nil {
		t.Fatal(err)
	}
	if err := c.QueryRow(ctx, "select pg_try_advisory_xact_lock($1)", key).Scan(&ok); err != nil || ok {
		t.Fatalf("exclusive try beside a shared holder = %v, %v; want false", ok, err)
	}
	if _, err := a.Exec(ctx, "select pg_advisory_unlock_shared($1)", key); err != nil {
		t.Fatal(err)
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, "select pg_try_advisory_xact_lock($1)", key).Scan(&ok); err != nil || !ok {
		t.Fatalf("exclusive try alone = %v, %v", ok, err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := a.Exec(ctx, "select pg_advisory_lock_shared($1)", key)
		got <- err
	}()
	waitLockWait(t, b)
	select {
	case <-got:
		t.Fatal("shared lock granted while the exclusive transaction lock is held")
	default:
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// TestListenerKilled: when the listening connection's backend is killed,
// the listener reconnects, takes its interests again and wakes its
// waiters, so a release still wakes them long before the holder's expiry.
func TestListenerKilled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	holder := mustTry(t, b.store, "k", time.Hour)
	got := make(chan error, 1)
	go func() {
		l, err := b.store.Acquire(ctx, "k", time.Minute)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	waitParked(t, b.store)
	var pids []uint32
	rows, err := b.pool.Query(ctx, `select pid from pg_stat_activity where datname = current_database()
		and (query like 'select pg_catalog.pg_advisory_lock_shared%' or query like 'set lock_timeout%')`)
	if err == nil {
		pids, err = pgx.CollectRows(rows, pgx.RowTo[uint32])
	}
	if err != nil || len(pids) != 1 {
		t.Fatalf("listener backends %v, %v; want one", pids, err)
	}
	if err := b.db.Server.TerminateBackend(ctx, pids[0]); err != nil {
		t.Fatal(err)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second): // the holder's lease had an hour left
		t.Fatal("the waiter was not woken after the listener's backend was killed")
	}
}
