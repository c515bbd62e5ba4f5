package leader

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// newInternal returns an elector on a fresh database with the lease table,
// and a hook dispatcher, for tests that drive a campaign and a term by
// hand.
func newInternal(t *testing.T, name string) (*Elector, *dispatcher, *pgtest.DB) {
	t.Helper()
	db := pgtest.New(t)
	pool := db.NewPool(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Name: name, Pool: pool, Store: store, TTL: 3 * time.Second, RetryInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	hooks := newDispatcher()
	t.Cleanup(func() {
		hooks.close()
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		_ = e.Close(cctx)
		_ = store.Close(cctx)
	})
	return e, hooks, db
}

// TestResignBeforeTermStarts: a Resign in the instant between the end of
// the campaign and the start of the term reaches the term, whose work is
// then not started.
func TestResignBeforeTermStarts(t *testing.T) {
	t.Parallel()
	e, hooks, _ := newInternal(t, "instant")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	tn, err := e.campaign(ctx, hooks)
	if err != nil {
		t.Fatal(err)
	}
	resigned := make(chan error, 1)
	go func() { resigned <- e.Resign(ctx) }()
	select {
	case <-tn.resign:
	case err := <-resigned:
		t.Fatalf("Resign returned %v without reaching the term about to start", err)
	case <-time.After(30 * time.Second):
		t.Fatal("Resign did not reach the term")
	}
	started := false
	reason := e.lead(ctx, tn, func(ctx context.Context, _ Term) error { started = true; <-ctx.Done(); return nil }, hooks)
	if started || !errors.Is(reason, ErrResigned) {
		t.Fatalf("work started: %v; term ended with %v, want ErrResigned", started, reason)
	}
	if err := <-resigned; err != nil {
		t.Fatalf("Resign: %v", err)
	}
}

// TestNoWorkOnLostLock: a term whose advisory lock is
// already known lost does not start its work.
func TestNoWorkOnLostLock(t *testing.T) {
	t.Parallel()
	e, hooks, db := newInternal(t, "lostlock")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	tn, err := e.campaign(ctx, hooks)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Server.TerminateBackend(ctx, tn.lock.PID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-tn.lock.Lost():
	case <-ctx.Done():
		t.Fatal("the Locker did not notice its session's death")
	}
	started := false
	reason := e.lead(ctx, tn, func(ctx context.Context, _ Term) error { started = true; <-ctx.Done(); return nil }, hooks)
	if started || !errors.Is(reason, ErrLost) {
		t.Fatalf("work started: %v; term ended with %v, want ErrLost", started, reason)
	}
}
