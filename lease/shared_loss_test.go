package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// TestSharedReaderLoss: a reader whose row stops being renewed loses its
// lease (Lost, Context) — here its row expired by the server's clock, and
// a writer got in — and a vanished reader (its store closed without
// releasing) holds a writer up only until its row expires.
func TestSharedReaderLoss(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	r := mustShared(t, b.store, "cfg", 3*time.Second, lease.WithKeepAlive())
	expire(t, b.pool, r.Name())
	w, err := b.store.TryAcquireExclusive(ctx, "cfg", time.Minute)
	if err != nil {
		t.Fatalf("writer after the reader's row expired: %v", err)
	}
	lossStart := time.Now()
	waitFor(t, r.Lost(), 30*time.Second, "the expired reader's loss")
	t.Logf("the expired reader was lost after %v", time.Since(lossStart))
	waitFor(t, r.Context().Done(), 30*time.Second, "the expired reader's Context")
	if !errors.Is(context.Cause(r.Context()), lease.ErrLost) {
		t.Fatalf("reader's cause %v, want ErrLost", context.Cause(r.Context()))
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}

	gone, err := lease.New(b.pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 2 * time.Second
	if _, err := gone.TryAcquireShared(ctx, "cfg", ttl, lease.WithKeepAlive()); err != nil {
		t.Fatal(err)
	}
	if err := gone.Close(ctx); err != nil { // abandons the reader: its row stays until its expiry
		t.Fatal(err)
	}
	start := time.Now()
	w, err = b.store.AcquireExclusive(ctx, "cfg", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the writer waited %v for a vanished reader of TTL %v", time.Since(start), ttl)
	if d := time.Since(start); d > ttl+20*time.Second {
		t.Errorf("writer waited %v for a vanished reader of TTL %v", d, ttl)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSharedWriterRenewsWhileWaiting: a writer without a keep-alive that
// waits for a reader longer than its own TTL renews its row meanwhile, so
// that it still keeps new readers out, and gets a live lease.
func TestSharedWriterRenewsWhileWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	r := mustShared(t, b.store, "slow", 3*time.Second, lease.WithKeepAlive())
	const ttl = 1500 * time.Millisecond // renewed at half: slack for a loaded machine
	got := make(chan *lease.Lease, 1)
	go func() {
		w, err := b.store.AcquireExclusive(ctx, "slow", ttl)
		if err != nil {
			t.Error(err)
		}
		got <- w
	}()
	waitHeld(t, b.store, "slow#w")
	first, err := b.store.Get(ctx, "slow#w")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for { // the writer's row renewed past its first TTL
		i, err := b.store.Get(ctx, "slow#w")
		if err != nil {
			t.Fatal(err)
		}
		if i.Token != first.Token {
			t.Fatalf("writer's row token %d, then %d: it was lost and taken again", first.Token, i.Token)
		}
		if i.Held && i.RenewedAt.Sub(first.AcquiredAt) > 2*ttl {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiting writer's row was not renewed: %+v", i)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, with a deadline
	}
	if _, err := b.store.TryAcquireShared(ctx, "slow", time.Minute); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("new reader while the writer waits: %v, want ErrHeld", err)
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w := <-got
	if w == nil {
		return
	}
	if w.Token() != first.Token || w.Err() != nil {
		t.Fatalf("writer token %d (row's %d), err %v", w.Token(), first.Token, w.Err())
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
