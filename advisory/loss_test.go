package advisory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// waitLost waits for lk's loss and returns how long it took from start.
func waitLost(t *testing.T, lk *advisory.Lock, start time.Time, within time.Duration) time.Duration {
	t.Helper()
	select {
	case <-lk.Lost():
	case <-time.After(within):
		t.Fatalf("Lost did not fire within %v", within)
	}
	took := time.Since(start)
	if err := lk.Err(); !errors.Is(err, advisory.ErrLost) {
		t.Fatalf("Err after loss = %v, want ErrLost", err)
	}
	if err := context.Cause(lk.Context()); !errors.Is(err, advisory.ErrLost) {
		t.Fatalf("Context cause after loss = %v, want ErrLost", err)
	}
	return took
}

// Both locks on one session (MaxSessions 1), so that one termination
// takes both: every lock of a dead session is announced lost.
func TestLossAfterTerminateBackend(t *testing.T) {
	t.Parallel()
	b := setup(t, advisory.Config{MaxSessions: 1})
	ctx := ctxT(t)
	a, err := b.locker.Lock(ctx, pglocks.KeyOf("loss-a"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := b.locker.RLock(ctx, pglocks.KeyOf("loss-c"))
	if err != nil {
		t.Fatal(err)
	}
	if a.PID() != c.PID() {
		t.Fatalf("locks on sessions %d and %d with MaxSessions 1", a.PID(), c.PID())
	}
	start := time.Now()
	if err := b.db.Server.TerminateBackend(ctx, a.PID()); err != nil {
		t.Fatal(err)
	}
	took := waitLost(t, a, start, 5*time.Second)
	t.Logf("loss announced %v after pg_terminate_backend returned", took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("loss announced after %v, want ≤ 1s", took)
	}
	waitLost(t, c, start, time.Second)
	for _, lk := range []*advisory.Lock{a, c} {
		if err := lk.Unlock(ctx); !errors.Is(err, advisory.ErrNotHeld) || !errors.Is(err, advisory.ErrLost) {
			t.Errorf("Unlock after loss = %v, want ErrNotHeld and ErrLost", err)
		}
	}
	// The dead session is replaced for new locks.
	lk, err := b.locker.TryLock(ctx, pglocks.KeyOf("loss-a"))
	if err != nil {
		t.Fatalf("TryLock after loss: %v", err)
	}
	if lk.PID() == a.PID() {
		t.Error("new lock on the dead session's pid")
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestDoCancelledOnLoss(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	key := pglocks.KeyOf("do-loss")
	err := b.locker.Do(ctx, key, func(fctx context.Context) error {
		hs, err := b.locker.Holders(fctx, key)
		if err != nil || len(hs) != 1 {
			t.Fatalf("Holders inside Do = %v, %v", hs, err)
		}
		// Everything of this locker (its session, and its listener if it
		// has connected yet) is terminated. On
		// the test's ctx: the loss it causes cancels fctx, perhaps before
		// TerminateApplication has counted its answer.
		if n, err := b.db.Server.TerminateApplication(ctx, b.app); err != nil || n < 1 {
			t.Fatalf("TerminateApplication = %d, %v", n, err)
		}
		select {
		case <-fctx.Done():
			return context.Cause(fctx)
		case <-time.After(5 * time.Second):
			t.Fatal("fn's context was not cancelled on loss")
			return nil
		}
	})
	if !errors.Is(err, advisory.ErrLost) {
		t.Fatalf("Do = %v, want ErrLost", err)
	}
	// The locker recovers: Do works again.
	ran := false
	if err := b.locker.Do(ctx, key, func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("Do after loss = %v (ran %v)", err, ran)
	}
}

func TestUnlockedLockIsNotLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	lk, err := b.locker.Lock(ctx, pglocks.KeyOf("quiet"))
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Lost():
		t.Fatal("Lost closed by Unlock")
	default:
	}
	if lk.Err() != nil {
		t.Fatalf("Err after Unlock = %v", lk.Err())
	}
	if lk.Context().Err() == nil {
		t.Fatal("Context not done after Unlock")
	}
}

func TestLossAfterRestart(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t)
	db := srv.NewDB(t)
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 2 })
	l := newLocker(t, pool, advisory.Config{})
	ctx := ctxT(t)
	lk, err := l.Lock(ctx, pglocks.KeyOf("restart"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- l.Do(ctx, pglocks.KeyOf("restart-do"), func(ctx context.Context) error {
			<-ctx.Done()
			return nil
		})
	}()
	waitFor(t, "Do to hold its lock", 10*time.Second, func() bool {
		held, err := advisory.IsHeld(ctx, pool, pglocks.KeyOf("restart-do"))
		return err == nil && held
	})
	start := time.Now()
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	took := waitLost(t, lk, start, 10*time.Second)
	t.Logf("loss announced %v after the restart began", took.Round(time.Millisecond))
	if err := <-done; !errors.Is(err, advisory.ErrLost) {
		t.Fatalf("Do across a restart = %v, want ErrLost", err)
	}
	// New locks work on the restarted server.
	waitFor(t, "a lock on the restarted server", 10*time.Second, func() bool {
		lk, err := l.TryLock(ctx, pglocks.KeyOf("restart"))
		if err != nil {
			return false
		}
		return lk.Unlock(ctx) == nil
	})
}

// A session that held no locks is not pinged, so its death goes unnoticed
// until it is used: TryLock then retries on a fresh session instead of
// failing.
func TestTryLockAfterIdleSessionDied(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	key := pglocks.KeyOf("idle-died")
	lk, err := b.locker.TryLock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	pid := lk.PID()
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.db.Server.TerminateBackend(ctx, pid); err != nil {
		t.Fatal(err)
	}
	lk, err = b.locker.TryLock(ctx, key)
	if err != nil {
		t.Fatalf("TryLock after its idle session died: %v", err)
	}
	if lk.PID() == pid {
		t.Error("the lock is on the dead session's pid")
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
