package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/lease"
)

// TestMaxHold: a kept-alive lease held past WithMaxHold ends as lost —
// Lost closed, Context's cause wrapping ErrLost and ErrMaxHold — and its
// row is released, so a waiter in another store gets the name long
// before the row's TTL would have run out.
func TestMaxHold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	const ttl = time.Minute
	reasons := make(chan pglocks.Reason, 1)
	holder := newStore(t, b.pool, lease.Config{Observer: &pglocks.Observer{End: func(e pglocks.EndEvent) { reasons <- e.Reason }}})
	l := mustTry(t, holder, "wedged", ttl, lease.WithKeepAlive(), lease.WithMaxHold(time.Second))
	other := newStore(t, b.pool, lease.Config{})
	got := make(chan *lease.Lease, 1)
	start := time.Now()
	go func() {
		next, err := other.Acquire(ctx, "wedged", ttl)
		if err != nil {
			t.Error(err)
		}
		got <- next
	}()
	waitFor(t, l.Lost(), 30*time.Second, "the loss at the max hold")
	waitFor(t, l.Context().Done(), 30*time.Second, "the end of Context at the max hold")
	cause := context.Cause(l.Context())
	if !errors.Is(cause, lease.ErrMaxHold) || !errors.Is(cause, lease.ErrLost) || !strings.Contains(cause.Error(), "max hold") {
		t.Fatalf("cause %v, want ErrLost and ErrMaxHold", cause)
	}
	if r := <-reasons; r != pglocks.ReasonMaxHold || !r.Lost() {
		t.Errorf("observed end %q, want %q, a loss", r, pglocks.ReasonMaxHold)
	}
	if err := l.Renew(ctx); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Renew after the max hold: %v, want ErrNotHeld", err)
	}
	select {
	case next := <-got:
		if next == nil {
			return
		}
		if next.Token() <= l.Token() {
			t.Fatalf("token %d after %d", next.Token(), l.Token())
		}
		t.Logf("the next holder got the name %v after the first took it", time.Since(start))
	case <-time.After(40 * time.Second): // the row would expire at 60 s
		t.Fatal("the name was not released at the max hold")
	}
}

// TestMaxHoldDo: Store.Do with WithMaxHold cancels fn's context at the
// max hold and returns an error wrapping ErrMaxHold; a reader of a shared
// lease with a max hold leaves in time for a writer.
func TestMaxHoldDo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	err := b.store.Do(ctx, "nightly", time.Minute, func(ctx context.Context) error {
		<-ctx.Done() // a job that would run for ever
		if !errors.Is(context.Cause(ctx), lease.ErrMaxHold) {
			t.Errorf("fn's cause %v, want ErrMaxHold", context.Cause(ctx))
		}
		return ctx.Err()
	}, lease.WithMaxHold(500*time.Millisecond))
	if !errors.Is(err, lease.ErrMaxHold) || !errors.Is(err, lease.ErrLost) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Do: %v, want ErrMaxHold, ErrLost and fn's context.Canceled", err)
	}
	if strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), "lease: lost") {
		t.Errorf("Do: %q, want one line that starts with the loss", err)
	}
	if held, err := b.store.IsHeld(ctx, "nightly"); err != nil || held {
		t.Fatalf("held %v, %v after Do returned", held, err)
	}

	r := mustShared(t, b.store, "rw", time.Minute, lease.WithKeepAlive(), lease.WithMaxHold(time.Second))
	w, err := b.store.AcquireExclusive(ctx, "rw", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(r.Err(), lease.ErrMaxHold) {
		t.Fatalf("reader ended with %v, want ErrMaxHold", r.Err())
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMaxHoldChecked: a max hold that is not positive is refused before
// anything is sent, by every call that takes options.
func TestMaxHoldChecked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	for _, d := range []time.Duration{0, -time.Second} {
		if _, err := b.store.TryAcquire(ctx, "x", time.Minute, lease.WithMaxHold(d)); err == nil || !strings.Contains(err.Error(), "WithMaxHold") {
			t.Errorf("TryAcquire with WithMaxHold(%v): %v, want an error naming WithMaxHold", d, err)
		}
		err := b.store.Do(ctx, "x", time.Minute, func(context.Context) error { return nil }, lease.WithMaxHold(d))
		if err == nil || !strings.Contains(err.Error(), "WithMaxHold") {
			t.Errorf("Do with WithMaxHold(%v): %v", d, err)
		}
	}
	l := mustTry(t, b.store, "y", time.Minute)
	if _, err := b.store.Resume(ctx, l.Handle(), lease.WithMaxHold(0)); err == nil || !strings.Contains(err.Error(), "WithMaxHold") {
		t.Errorf("Resume with WithMaxHold(0): %v", err)
	}
	if held, err := b.store.IsHeld(ctx, "x"); err != nil || held {
		t.Fatalf("x held %v, %v after refused calls", held, err)
	}
}
