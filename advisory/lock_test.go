package advisory_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
)

func TestTryLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := newLocker(t, b.pool, advisory.Config{ApplicationName: b.app})
	ctx := ctxT(t)
	key := pglocks.KeyOf("trylock")

	lk, err := b.locker.TryLock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("OtherLockerGetsErrLocked", func(t *testing.T) {
		_, err := other.TryLock(ctx, key)
		if !errors.Is(err, advisory.ErrLocked) {
			t.Fatalf("TryLock on a held key: got %v, want ErrLocked", err)
		}
	})
	t.Run("SameLockerGetsErrLocked", func(t *testing.T) {
		_, err := b.locker.TryLock(ctx, key)
		if !errors.Is(err, advisory.ErrLocked) {
			t.Fatalf("TryLock on a key this locker holds: got %v, want ErrLocked", err)
		}
		// The same lock under another spelling of the key.
		_, err = b.locker.TryLock(ctx, pglocks.Int64Key(key.Int64()))
		if !errors.Is(err, advisory.ErrLocked) {
			t.Fatalf("TryLock on Int64Key of a held KeyOf: got %v, want ErrLocked", err)
		}
	})
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	t.Run("FreeAfterUnlock", func(t *testing.T) {
		if held, err := advisory.IsHeld(ctx, b.pool, key); err != nil || held {
			t.Fatalf("IsHeld after Unlock = %v, %v; want false", held, err)
		}
		lk, err := other.TryLock(ctx, key)
		if err != nil {
			t.Fatalf("TryLock after Unlock: %v", err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("SecondUnlockIsErrNotHeld", func(t *testing.T) {
		err := lk.Unlock(ctx)
		if !errors.Is(err, advisory.ErrNotHeld) {
			t.Fatalf("second Unlock: got %v, want ErrNotHeld", err)
		}
	})
	t.Run("PairKeyIsAnotherSpace", func(t *testing.T) {
		a, err := b.locker.TryLock(ctx, pglocks.PairKey(0, 7))
		if err != nil {
			t.Fatal(err)
		}
		c, err := other.TryLock(ctx, pglocks.Int64Key(7))
		if err != nil {
			t.Fatalf("Int64Key(7) while PairKey(0, 7) is held: %v", err)
		}
		if _, err := other.TryLock(ctx, pglocks.PairKey(0, 7)); !errors.Is(err, advisory.ErrLocked) {
			t.Fatalf("PairKey(0, 7) held elsewhere: got %v, want ErrLocked", err)
		}
		for _, lk := range []*advisory.Lock{a, c} {
			if err := lk.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestExclusion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := newLocker(t, b.pool, advisory.Config{ApplicationName: b.app})
	// 5,000 contended lock/unlock pairs: a throughput the shared server
	// gives within seconds when quiet, minutes when the machine is loaded.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	key := pglocks.KeyOf("exclusion")
	const goroutines, iterations = 50, 100
	counter := 0 // unprotected on purpose: the lock protects it
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		l := b.locker
		if g%2 == 1 {
			l = other // half contend from another locker, as another process would
		}
		wg.Go(func() {
			for range iterations {
				lk, err := l.Lock(ctx, key)
				if err != nil {
					errs <- err
					return
				}
				c := counter
				counter = c + 1
				if err := lk.Unlock(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if counter != goroutines*iterations {
		t.Fatalf("counter = %d, want %d", counter, goroutines*iterations)
	}
}

func TestLockHonoursContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := newLocker(t, b.pool, advisory.Config{ApplicationName: b.app})
	ctx := ctxT(t)
	key := pglocks.KeyOf("ctx")
	lk, err := b.locker.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []*advisory.Locker{b.locker, other} {
		const timeout = 50 * time.Millisecond
		start := time.Now() // before the deadline is set: the wait can be no shorter
		wctx, cancel := context.WithTimeout(ctx, timeout)
		_, err := l.Lock(wctx, key)
		took := time.Since(start)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock on a held key: got %v, want DeadlineExceeded", err)
		}
		if took < timeout || took > timeout+time.Second { // generous: a loaded machine

			t.Errorf("Lock with a %v timeout returned after %v", timeout, took)
		}
	}
	t.Run("Cancel", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := other.Lock(cctx, key)
			done <- err
		}()
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("got %v, want Canceled", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Lock ignored cancellation")
		}
	})
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Nothing left behind: the key can be taken as soon as the abandoned
	// tries' answers are in (one round trip).
	waitFor(t, "the key to be free", 5*time.Second, func() bool {
		lk, err = other.TryLock(ctx, key)
		if err != nil && !errors.Is(err, advisory.ErrLocked) {
			t.Fatal(err)
		}
		return err == nil
	})
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestDoReleasesOnPanic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	key := pglocks.KeyOf("do-panic")
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not come through Do")
			}
		}()
		_ = b.locker.Do(ctx, key, func(context.Context) error { panic("boom") })
	}()
	if held, err := advisory.IsHeld(ctx, b.pool, key); err != nil || held {
		t.Fatalf("IsHeld after a panic in Do = %v, %v; want false", held, err)
	}
	wantErr := errors.New("fn failed")
	if err := b.locker.Do(ctx, key, func(context.Context) error { return wantErr }); !errors.Is(err, wantErr) {
		t.Fatalf("Do = %v, want fn's error", err)
	}
}
