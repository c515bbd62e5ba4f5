package advisory_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
)

func TestPsqlInterop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := b.db.Conn(t)
	ctx := ctxT(t)
	const name = "interop:report"
	key := pglocks.KeyOf(name)
	psqlTry := func() bool {
		var ok bool
		if err := conn.QueryRow(ctx, "select pg_try_advisory_lock(hashtextextended($1, 0))", name).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	psqlUnlock := func() {
		var ok bool
		if err := conn.QueryRow(ctx, "select pg_advisory_unlock(hashtextextended($1, 0))", name).Scan(&ok); err != nil || !ok {
			t.Fatalf("pg_advisory_unlock = %v, %v", ok, err)
		}
	}

	t.Run("PglocksHolderBlocksPsql", func(t *testing.T) {
		lk, err := b.locker.TryLock(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if psqlTry() {
			t.Fatal("pg_try_advisory_lock(hashtextextended(name, 0)) succeeded while pglocks holds KeyOf(name)")
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if !psqlTry() {
			t.Fatal("pg_try_advisory_lock failed after Unlock")
		}
		psqlUnlock()
	})
	t.Run("PsqlHolderBlocksPglocks", func(t *testing.T) {
		if !psqlTry() {
			t.Fatal("pg_try_advisory_lock failed on a free key")
		}
		if _, err := b.locker.TryLock(ctx, key); !errors.Is(err, advisory.ErrLocked) {
			t.Fatalf("TryLock while psql holds the key: %v, want ErrLocked", err)
		}
		// A waiting Lock picks the key up by polling: psql does not notify.
		got := make(chan error, 1)
		go func() {
			lk, err := b.locker.Lock(ctx, key)
			if err == nil {
				err = lk.Unlock(ctx)
			}
			got <- err
		}()
		psqlUnlock()
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Lock did not pick up a key psql released")
		}
	})
	t.Run("HoldersShowsThePglocksSession", func(t *testing.T) {
		lk, err := b.locker.Lock(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		// A plain session waits on the server for the key: a waiter.
		waiter := b.db.Conn(t)
		waited := make(chan error, 1)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			_, err := waiter.Exec(wctx, "set lock_timeout = '30s'; select pg_advisory_lock(hashtextextended('"+name+"', 0)); select pg_advisory_unlock_all()")
			waited <- err
		}()
		var hs []advisory.Holder
		waitFor(t, "the plain session to wait", 10*time.Second, func() bool {
			hs, err = b.locker.Holders(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			return len(hs) == 2
		})
		h := hs[0]
		if !h.Granted || h.PID != lk.PID() || h.ApplicationName != b.app || !h.Exclusive() || h.Since.IsZero() {
			t.Errorf("holder = %+v, want granted exclusive, pid %d, application %q", h, lk.PID(), b.app)
		}
		if h.ClientAddr == "" {
			t.Errorf("holder has no client address (%+v)", h)
		}
		w := hs[1]
		if w.Granted || w.PID == 0 || w.Mode != "ExclusiveLock" {
			t.Errorf("waiter = %+v, want a not-granted ExclusiveLock", w)
		}
		if held, err := b.locker.IsHeld(ctx, key); err != nil || !held {
			t.Errorf("IsHeld = %v, %v; want true", held, err)
		}
		// Holders of another database's same key are not shown.
		other := b.db.Server.NewDB(t).Conn(t)
		if hs, err := advisory.Holders(ctx, other, key); err != nil || len(hs) != 0 {
			t.Errorf("Holders in another database = %v, %v; want none", hs, err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-waited; err != nil {
			t.Fatal(err)
		}
	})
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	done, cancel := context.WithCancel(ctx)
	cancel()
	key := pglocks.KeyOf("bad")
	check := func(t *testing.T, err error, want error, mention string) {
		t.Helper()
		if err == nil {
			t.Fatal("no error")
		}
		if want != nil && !errors.Is(err, want) {
			t.Errorf("error %q does not wrap %v", err, want)
		}
		if !strings.Contains(err.Error(), mention) {
			t.Errorf("error %q does not mention %q", err, mention)
		}
	}
	t.Run("NilPool", func(t *testing.T) {
		_, err := advisory.New(nil, advisory.Config{})
		check(t, err, nil, "nil pool")
	})
	t.Run("BadConfig", func(t *testing.T) {
		_, err := advisory.New(b.pool, advisory.Config{MinBackoff: time.Second, MaxBackoff: time.Millisecond})
		check(t, err, nil, "MinBackoff")
		_, err = advisory.New(b.pool, advisory.Config{QueryTimeout: time.Minute})
		check(t, err, nil, "KeepalivesIdle")
	})
	t.Run("ZeroKey", func(t *testing.T) {
		_, err := b.locker.TryLock(ctx, pglocks.Key{})
		check(t, err, pglocks.ErrInvalidKey, "zero Key")
	})
	t.Run("InvalidName", func(t *testing.T) {
		_, err := b.locker.Lock(ctx, pglocks.KeyOf("nul\x00byte"))
		check(t, err, pglocks.ErrInvalidKey, "NUL")
		err = advisory.TryXactLock(ctx, nil, pglocks.KeyOf(""))
		check(t, err, nil, "nil tx")
	})
	t.Run("ContextDone", func(t *testing.T) {
		_, err := b.locker.Lock(done, key)
		check(t, err, context.Canceled, "context already done")
	})
	t.Run("ClosedLocker", func(t *testing.T) {
		l := newLocker(t, b.pool, advisory.Config{})
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
		_, err := l.TryLock(ctx, key)
		check(t, err, advisory.ErrClosed, "closed")
		if err := l.Close(ctx); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
	t.Run("NilFn", func(t *testing.T) {
		check(t, b.locker.Do(ctx, key, nil), nil, "nil fn")
	})
}
