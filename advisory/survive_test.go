package advisory_test

import (
	"context"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// A waiting Lock goes on waiting when its session is terminated, and takes
// the lock when the holder unlocks.
func TestLockSurvivesTerminatedSession(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	key := pglocks.KeyOf("survive-terminate")
	holder, err := b.locker.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	app := b.app + "-waiter"
	waiter := newLocker(t, b.pool, advisory.Config{ApplicationName: app})
	got := lockInBackground(ctx, waiter, key)
	conn := b.db.Conn(t)
	waitFor(t, "the waiter's session", 10*time.Second, func() bool {
		var n int
		err := conn.QueryRow(ctx, "select count(*) from pg_stat_activity where application_name = $1", app).Scan(&n)
		return err == nil && n > 0
	})
	for range 2 {
		if _, err := b.db.Server.TerminateApplication(ctx, app); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the waiter to open a new session", 10*time.Second, func() bool {
			var n int
			err := conn.QueryRow(ctx, "select count(*) from pg_stat_activity where application_name = $1", app).Scan(&n)
			return err == nil && n > 0
		})
	}
	select {
	case err := <-got:
		t.Fatalf("waiting Lock returned while the lock was held: %v", err)
	default:
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiting Lock after its session was terminated: %v", err)
	}
}

// A waiting Lock goes on across a server restart.
func TestLockSurvivesRestart(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t)
	db := srv.NewDB(t)
	ctx := ctxT(t)
	key := pglocks.KeyOf("survive-restart")
	holder := db.Conn(t)
	if _, err := holder.Exec(ctx, "select pg_advisory_lock($1)", key.Int64()); err != nil {
		t.Fatal(err)
	}
	l := newLocker(t, db.NewPool(t), advisory.Config{})
	got := lockInBackground(ctx, l, key)
	waitFor(t, "the waiter's session", 10*time.Second, func() bool {
		var n int
		err := holder.QueryRow(ctx, "select count(*) from pg_stat_activity where application_name = 'pglocks'").Scan(&n)
		return err == nil && n > 0
	})
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiting Lock across a restart: %v", err)
	}
}

// A waiting Lock goes on when its connection is reset under it.
func TestLockSurvivesConnectionReset(t *testing.T) {
	t.Parallel()
	b, p, waiter := proxied(t, advisory.Config{})
	ctx := ctxT(t)
	key := pglocks.KeyOf("survive-reset")
	holder, err := b.locker.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := lockInBackground(ctx, waiter, key)
	for range 3 {
		waitFor(t, "the waiter's connection", 10*time.Second, func() bool { return p.Reset() > 0 })
	}
	select {
	case err := <-got:
		t.Fatalf("waiting Lock returned while the lock was held: %v", err)
	default:
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiting Lock after its connection was reset: %v", err)
		}
	case <-wctx.Done():
		t.Fatal("the waiter did not take the lock")
	}
}

// lockInBackground waits for key with l.Lock, unlocks it once granted, and
// sends the first error (nil when both worked).
func lockInBackground(ctx context.Context, l *advisory.Locker, key pglocks.Key) <-chan error {
	got := make(chan error, 1)
	go func() {
		lk, err := l.Lock(ctx, key)
		if err == nil {
			err = lk.Unlock(ctx)
		}
		got <- err
	}()
	return got
}
