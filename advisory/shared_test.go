package advisory_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
)

func TestSharedExclusiveMatrix(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := newLocker(t, b.pool, advisory.Config{ApplicationName: b.app})
	ctx := ctxT(t)
	type mode bool
	const shared, exclusive mode = true, false
	name := map[mode]string{shared: "Shared", exclusive: "Exclusive"}
	try := func(l *advisory.Locker, m mode, key pglocks.Key) (*advisory.Lock, error) {
		if m == shared {
			return l.TryRLock(ctx, key)
		}
		return l.TryLock(ctx, key)
	}
	lockers := map[string]*advisory.Locker{"SameLocker": b.locker, "OtherLocker": other}
	for where, second := range lockers {
		for _, first := range []mode{shared, exclusive} {
			for _, then := range []mode{shared, exclusive} {
				compatible := first == shared && then == shared
				t.Run(fmt.Sprintf("%s/%sThen%s", where, name[first], name[then]), func(t *testing.T) {
					key := pglocks.KeyOf(fmt.Sprintf("matrix-%s-%v-%v", where, first, then))
					a, err := try(b.locker, first, key)
					if err != nil {
						t.Fatal(err)
					}
					c, err := try(second, then, key)
					switch {
					case compatible && err != nil:
						t.Fatalf("second %s lock: %v, want success", name[then], err)
					case !compatible && !errors.Is(err, advisory.ErrLocked):
						t.Fatalf("second %s lock: %v, want ErrLocked", name[then], err)
					}
					if c != nil {
						if !c.Shared() {
							t.Error("Shared() = false for a shared lock")
						}
						if err := c.Unlock(ctx); err != nil {
							t.Fatal(err)
						}
					}
					if err := a.Unlock(ctx); err != nil {
						t.Fatal(err)
					}
					// Both unlocked: the key is free on the server.
					if held, err := advisory.IsHeld(ctx, b.pool, key); err != nil || held {
						t.Fatalf("IsHeld after both unlocks = %v, %v", held, err)
					}
				})
			}
		}
	}
}

// A writer waiting in this process stops new readers of this process, so a
// stream of readers cannot starve it.
func TestWriterNotStarved(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	key := pglocks.KeyOf("writer-first")
	r1, err := b.locker.RLock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	wgot := make(chan *advisory.Lock, 1)
	go func() {
		w, err := b.locker.Lock(ctx, key)
		if err != nil {
			t.Error(err)
		}
		wgot <- w
	}()
	waitFor(t, "the writer to queue", 10*time.Second, func() bool {
		r, err := b.locker.TryRLock(ctx, key)
		if err == nil {
			if err := r.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			return false
		}
		if !errors.Is(err, advisory.ErrLocked) {
			t.Fatal(err)
		}
		return true
	})
	if err := r1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	w := <-wgot
	if w == nil {
		t.FailNow()
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
