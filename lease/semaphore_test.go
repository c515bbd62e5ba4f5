package lease_test

import (
	"context"
	"errors"
	"github.com/pglocks/pglocks/internal/logtest"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
)

func TestSemaphoreBasics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	sem, err := b.store.Semaphore("pool", 3)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := sem.TryAcquire(ctx, 2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if p2.N() != 2 || p2.Leases()[0].Name() != "pool#0" || p2.Leases()[1].Name() != "pool#1" {
		t.Fatalf("permits %v", p2.Leases())
	}
	_, err = sem.TryAcquire(ctx, 2, time.Minute)
	var full *lease.FullError
	if !errors.As(err, &full) || !errors.Is(err, lease.ErrHeld) || full.Held != 2 || full.Limit != 3 || full.Want != 2 {
		t.Fatalf("err = %v (%+v), want a FullError 2 of 3 held", err, full)
	}
	p1, err := sem.TryAcquire(ctx, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := sem.Count(ctx); err != nil || n != 3 {
		t.Fatalf("Count = %d, %v, want 3", n, err)
	}
	hs, err := sem.Holders(ctx)
	if err != nil || len(hs) != 3 {
		t.Fatalf("Holders = %v, %v", hs, err)
	}
	if _, err := sem.TryAcquire(ctx, 4, time.Minute); !errors.Is(err, lease.ErrInvalidPermits) {
		t.Fatalf("n above the limit: %v", err)
	}
	// Lower the limit to 1: no permit is revoked, none granted until the
	// count is below 1.
	if err := sem.SetLimit(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := p1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sem.TryAcquire(ctx, 1, time.Minute); !errors.As(err, &full) || full.Limit != 1 || full.Held != 2 {
		t.Fatalf("after lowering: %v", err)
	}
	if p2.Context().Err() != nil {
		t.Fatal("lowering the limit ended live permits")
	}
	if err := p2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select { // the permit's Context ends by an AfterFunc of its lease's: soon after, not inside Release
	case <-p2.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Permits' context not ended by Release")
	}
	p, err := sem.TryAcquire(ctx, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if p.Tokens()[0] != 2 {
		t.Errorf("slot 0's second permit has token %d, want 2", p.Tokens()[0])
	}
	if lim, err := sem.Limit(ctx); err != nil || lim != 1 {
		t.Errorf("Limit = %d, %v", lim, err)
	}
	// Another process's Semaphore with another limit uses the stored one.
	other, _ := newStore(t, b.pool, lease.Config{}).Semaphore("pool", 5)
	if _, err := other.TryAcquire(ctx, 1, time.Minute); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("the stored limit was not shared: %v", err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestSemaphoreBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	for _, c := range []struct {
		name  string
		limit int
		want  string
	}{
		{"", 1, "empty name"},
		{"s", 0, "limit 0"},
		{"s", -1, "limit -1"},
		{"s", lease.MaxSemaphoreLimit + 1, "limit"},
		{strings.Repeat("x", lease.MaxNameLen), 1, "MaxNameLen"},
	} {
		if _, err := b.store.Semaphore(c.name, c.limit); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Semaphore(%.10q, %d) = %v, want an error naming %q", c.name, c.limit, err, c.want)
		}
	}
	sem, err := b.store.Semaphore("s", 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, -1, 3} {
		if _, err := sem.Acquire(ctx, n, time.Minute); !errors.Is(err, lease.ErrInvalidPermits) {
			t.Errorf("Acquire(n=%d) = %v, want ErrInvalidPermits", n, err)
		}
	}
	if _, err := sem.TryAcquire(ctx, 1, 0); !errors.Is(err, lease.ErrInvalidTTL) {
		t.Errorf("ttl 0: %v", err)
	}
	if err := sem.SetLimit(ctx, 0); !errors.Is(err, lease.ErrInvalidPermits) {
		t.Errorf("SetLimit(0): %v", err)
	}
	if n, err := sem.Count(ctx); err != nil || n != 0 {
		t.Errorf("held after bad input: %d, %v", n, err)
	}
}

// TestSemaphoreNoStarvation: a waiter for 3 permits of 3 is not starved by
// a stream of single-permit takers that keep at least one permit held at
// every moment: once it holds the turn, released permits are kept for it.
func TestSemaphoreNoStarvation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	sem, _ := b.store.Semaphore("starve", 3)
	sctx, stop := context.WithCancel(ctx) // the takers'
	done := make(chan struct{})
	// Two takers, each holding one permit and taking its next one before
	// releasing the last: without the turn, 3 free never happens.
	takers := newStore(t, b.pool, lease.Config{})
	tsem, _ := takers.Semaphore("starve", 3)
	ready := make(chan struct{}, 2)
	for range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			cur, err := tsem.Acquire(sctx, 1, time.Minute)
			if err != nil {
				t.Error(err)
				return
			}
			ready <- struct{}{}
			for sctx.Err() == nil {
				tctx, cancel := context.WithTimeout(sctx, 200*time.Millisecond)
				next, err := tsem.Acquire(tctx, 1, time.Minute)
				cancel()
				_ = cur.Release(ctx)
				if err != nil {
					if next, err = tsem.Acquire(sctx, 1, time.Minute); err != nil {
						return // stopped
					}
				}
				cur = next
			}
			_ = cur.Release(ctx)
		}()
	}
	<-ready
	<-ready
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p, err := sem.Acquire(wctx, 3, time.Minute)
	stop()
	<-done
	<-done
	if err != nil {
		t.Fatalf("the waiter for 3 permits starved: %v", err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSemaphoreStoredLimitSaysSo: Semaphore(name, 5) after 3 was stored
// grants 3; its FullError names both limits and SetLimit, and the Logger
// hears it once at Info; after SetLimit(5) the handle grants 5.
func TestSemaphoreStoredLimitSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	three, err := b.store.Semaphore("exports", 3)
	if err != nil {
		t.Fatal(err)
	}
	p, err := three.TryAcquire(ctx, 3, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Release(ctx) }()
	rec, log := logtest.New()
	five, err := newStore(t, b.pool, lease.Config{Logger: log}).Semaphore("exports", 5)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_, err = five.TryAcquire(ctx, 1, time.Minute)
		var full *lease.FullError
		if !errors.As(err, &full) || full.Limit != 3 ||
			!strings.Contains(err.Error(), "the limit stored in the table is 3, not the 5 this Semaphore was given: Semaphore.SetLimit changes it") {
			t.Fatalf("TryAcquire on a stored limit of 3 made with 5: %v", err)
		}
	}
	var infos int
	for _, r := range rec.Records() {
		if r.Level == slog.LevelInfo && strings.Contains(r.Msg, "stored in the table is 3") {
			infos++
		}
	}
	if infos != 1 {
		t.Errorf("%d Info records of the stored limit, want 1: %v", infos, rec.Records())
	}
	if err := five.SetLimit(ctx, 5); err != nil {
		t.Fatal(err)
	}
	q, err := five.TryAcquire(ctx, 2, time.Minute)
	if err != nil {
		t.Fatalf("after SetLimit(5), 2 more permits: %v", err)
	}
	defer func() { _ = q.Release(ctx) }()
	if _, err := five.TryAcquire(ctx, 1, time.Minute); err == nil || strings.Contains(err.Error(), "stored in the table") {
		t.Errorf("full at the limit it set: %v, want a FullError without the note", err)
	}
}
