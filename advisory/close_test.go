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

func TestCloseReleases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	l := newLocker(t, b.pool, advisory.Config{ApplicationName: b.app})
	var locks []*advisory.Lock
	for i := range 10 {
		lk, err := l.Lock(ctx, pglocks.Int64Key(int64(i)))
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, lk)
	}
	// A waiter on a key held elsewhere returns ErrClosed at Close.
	blocker, err := b.locker.Lock(ctx, pglocks.KeyOf("close-wait"))
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := l.Lock(ctx, pglocks.KeyOf("close-wait"))
		waiting <- err
	}()
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waiting; !errors.Is(err, advisory.ErrClosed) {
		t.Errorf("waiting Lock at Close = %v, want ErrClosed", err)
	}
	for _, lk := range locks {
		select {
		case <-lk.Lost():
		default:
			t.Fatal("Lost not closed for a lock released by Close")
		}
		if err := lk.Err(); !errors.Is(err, advisory.ErrClosed) {
			t.Errorf("Err = %v, want ErrClosed", err)
		}
		if err := lk.Unlock(ctx); !errors.Is(err, advisory.ErrNotHeld) {
			t.Errorf("Unlock after Close = %v, want ErrNotHeld", err)
		}
	}
	if err := blocker.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if held, waiting := countAdvisory(t, b.pool); held != 0 || waiting != 0 {
		t.Errorf("after Close: %d advisory locks held, %d awaited", held, waiting)
	}
	if err := l.Close(ctx); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

// An Unlock whose ctx is already done still releases the lock, in the
// background, and says so.
func TestUnlockWithDoneContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	key := pglocks.KeyOf("unlock-done")
	lk, err := b.locker.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	err = lk.Unlock(done)
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Unlock with a done ctx = %v, want nil or Canceled", err)
	}
	waitFor(t, "the background release", 5*time.Second, func() bool {
		held, err := advisory.IsHeld(ctx, b.pool, key)
		return err == nil && !held
	})
	if err := lk.Unlock(ctx); !errors.Is(err, advisory.ErrNotHeld) {
		t.Fatalf("second Unlock = %v, want ErrNotHeld", err)
	}
	select {
	case <-lk.Lost():
		t.Fatal("Lost closed by an Unlock")
	default:
	}
}

// Close while many goroutines lock, wait and unlock: every call returns,
// nothing stays held, and no goroutine is left behind (goleak).
func TestCloseUnderLoad(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	l := newLocker(t, b.pool, advisory.Config{ApplicationName: b.app + "-closing"})
	blocker, err := b.locker.Lock(ctx, pglocks.KeyOf("held-elsewhere"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Unlock(ctx) }()
	var wg sync.WaitGroup
	for g := range 20 {
		wg.Go(func() {
			for {
				key := pglocks.Int64Key(int64(g % 4))
				if g%5 == 0 {
					key = pglocks.KeyOf("held-elsewhere") // waits until Close
				}
				lk, err := l.Lock(ctx, key)
				if err != nil {
					if !errors.Is(err, advisory.ErrClosed) {
						t.Errorf("Lock during Close = %v, want ErrClosed", err)
					}
					return
				}
				err = lk.Unlock(ctx)
				if err != nil && !errors.Is(err, advisory.ErrNotHeld) && !errors.Is(err, advisory.ErrClosed) {
					t.Errorf("Unlock during Close = %v", err)
				}
			}
		})
	}
	waitFor(t, "the workers to run", 10*time.Second, func() bool {
		held, _ := countAdvisory(t, b.pool)
		return held > 1
	})
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("calls still running 10s after Close")
	}
	// Close closes the Locker's sessions; the server frees their locks as
	// each backend exits, which a loaded machine may take a while to see.
	waitFor(t, "only the blocker's lock held after Close", 30*time.Second, func() bool {
		held, waiting := countAdvisory(t, b.pool)
		return held == 1 && waiting == 0
	})
}
