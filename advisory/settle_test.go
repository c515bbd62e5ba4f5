package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// Role defaults cannot cancel or end the Locker's sessions: a role with
// statement_timeout = 1ms, or idle_session_timeout, loses no lock.
func TestRoleTimeoutsKeepLocks(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, setting := range []string{"statement_timeout = '1ms'", "idle_session_timeout = '100ms'"} {
		t.Run(strings.Fields(setting)[0], func(t *testing.T) {
			role := createRole(t, db, setting)
			pool := lazyPool(t, withUser(t, db.DSN, role, "right"))
			l := newLocker(t, pool, advisory.Config{MaxSessions: 1})
			ctx := ctxT(t)
			var held []*advisory.Lock
			for i := range 200 {
				lk, err := l.TryLock(ctx, pglocks.KeyOf(fmt.Sprintf("role-timeout-%d", i)))
				if err != nil {
					t.Fatalf("TryLock %d: %v", i, err)
				}
				held = append(held, lk)
			}
			// Let the session idle past the idle timeout while churning
			// other keys, so both settings get their chance.
			until := time.Now().Add(time.Second)
			for i := 0; time.Now().Before(until); i++ {
				lk, err := l.TryLock(ctx, pglocks.KeyOf(fmt.Sprintf("churn-%d", i%10)))
				if err != nil {
					t.Fatalf("churn TryLock: %v", err)
				}
				if err := lk.Unlock(ctx); err != nil {
					t.Fatalf("churn Unlock: %v", err)
				}
				if i%50 == 0 {
					idle := time.NewTimer(400 * time.Millisecond)
					select {
					case <-idle.C:
					case <-held[0].Lost():
						idle.Stop()
					}
				}
			}
			for i, lk := range held {
				if err := lk.Err(); err != nil {
					t.Fatalf("lock %d lost: %v", i, err)
				}
				if err := lk.Unlock(ctx); err != nil {
					t.Fatalf("unlock %d: %v", i, err)
				}
			}
		})
	}
}

// A statement that fails on a live session does not kill the other locks
// on it (design weakness 6): the Locker settles the session's state from
// pg_locks and reports the error.
func TestFailedStatementKeepsOtherLocks(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	role := createRole(t, db)
	ctx := ctxT(t)
	admin := db.Conn(t)
	if _, err := admin.Exec(ctx, "revoke execute on function pg_notify(text, text) from public"); err != nil {
		t.Fatal(err)
	}
	l := newLocker(t, lazyPool(t, withUser(t, db.DSN, role, "right")), advisory.Config{MaxSessions: 1})
	innocent, err := l.TryLock(ctx, pglocks.KeyOf("innocent"))
	if err != nil {
		t.Fatal(err)
	}
	// A waiting Lock's try calls pg_notify, which this role may not.
	_, err = l.Lock(ctx, pglocks.KeyOf("needs-notify"))
	t.Logf("Lock without EXECUTE on pg_notify: %v", err)
	if err == nil || !strings.Contains(err.Error(), "42501") {
		t.Fatalf("Lock = %v, want the 42501 error", err)
	}
	if err := innocent.Err(); err != nil {
		t.Fatalf("the innocent lock was lost: %v", err)
	}
	if held, err := advisory.IsHeld(ctx, admin, pglocks.KeyOf("innocent")); err != nil || !held {
		t.Fatalf("IsHeld(innocent) = %v, %v", held, err)
	}
	if held, err := advisory.IsHeld(ctx, admin, pglocks.KeyOf("needs-notify")); err != nil || held {
		t.Fatalf("IsHeld(needs-notify) = %v, %v: the failed Lock left a lock", held, err)
	}
	// An unlock that fails leaves the lock held, and can be retried.
	if _, err := admin.Exec(ctx, "revoke execute on function pg_advisory_unlock(bigint) from public"); err != nil {
		t.Fatal(err)
	}
	err = innocent.Unlock(ctx)
	t.Logf("Unlock without EXECUTE on pg_advisory_unlock: %v", err)
	if err == nil || !strings.Contains(err.Error(), "still held") {
		t.Fatalf("Unlock = %v, want an error saying the lock is still held", err)
	}
	if err := innocent.Err(); err != nil {
		t.Fatalf("the lock was lost by a failed unlock: %v", err)
	}
	if held, err := advisory.IsHeld(ctx, admin, pglocks.KeyOf("innocent")); err != nil || !held {
		t.Fatalf("IsHeld(innocent) after the failed unlock = %v, %v", held, err)
	}
	if _, err := admin.Exec(ctx, "grant execute on function pg_advisory_unlock(bigint) to public"); err != nil {
		t.Fatal(err)
	}
	if err := innocent.Unlock(ctx); err != nil {
		t.Fatalf("Unlock again: %v", err)
	}
	if held, err := advisory.IsHeld(ctx, admin, pglocks.KeyOf("innocent")); err != nil || held {
		t.Fatalf("IsHeld(innocent) after Unlock = %v, %v", held, err)
	}
}

// Bad input gets a named error, never a panic.
func TestBadInputNoPanic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	for _, ch := range []string{"chan\x00nel", "bad-name", "Ünï"} {
		if _, err := advisory.New(b.pool, advisory.Config{Channel: ch}); err == nil || !strings.Contains(err.Error(), "Channel") {
			t.Errorf("New with Channel %q = %v, want an error naming Channel", ch, err)
		}
	}
	var nilCtx context.Context
	calls := map[string]func() error{
		"NilLocker.Close": func() error { return (*advisory.Locker)(nil).Close(ctx) },
		"NilLock.Unlock":  func() error { return (*advisory.Lock)(nil).Unlock(ctx) },
		"NilLocker.Do": func() error {
			return (*advisory.Locker)(nil).Do(ctx, pglocks.KeyOf("x"), func(context.Context) error { return nil })
		},
		"NilLocker.IsHeld": func() error { _, err := (*advisory.Locker)(nil).IsHeld(ctx, pglocks.KeyOf("x")); return err },
		"NilLock.Err":      func() error { return (*advisory.Lock)(nil).Err() },
		"Do.NilCtx": func() error {
			return b.locker.Do(nilCtx, pglocks.KeyOf("x"), func(context.Context) error { return nil })
		},
		"Lock.NilCtx":      func() error { _, err := b.locker.Lock(nilCtx, pglocks.KeyOf("x")); return err },
		"Close.NilCtx":     func() error { return b.locker.Close(nilCtx) },
		"NilLocker.Config": func() error { _ = (*advisory.Locker)(nil).Config(); return errors.New("no panic") },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("panic: %v", p)
				}
			}()
			if err := call(); err == nil {
				t.Fatal("no error")
			} else {
				t.Log(err)
			}
		})
	}
}
