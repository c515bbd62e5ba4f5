package lease_test

import (
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
)

func TestInspect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	a := mustTry(t, b.store, "a", time.Minute, lease.WithMetadata(json.RawMessage(`{"job": 7}`)))
	mustTry(t, b.store, "c", time.Minute)
	rel := mustTry(t, b.store, "b", time.Minute)
	if err := rel.Release(ctx); err != nil {
		t.Fatal(err)
	}

	t.Run("Get", func(t *testing.T) {
		i, err := b.store.Get(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		host, _ := os.Hostname()
		if !i.Held || i.Owner != a.Owner() || i.Token != 1 || i.TTL != time.Minute ||
			i.TimeLeft <= 50*time.Second || i.Hostname != host || i.PID != os.Getpid() {
			t.Fatalf("Get = %+v", i)
		}
		var meta struct{ Job int }
		if err := json.Unmarshal(i.Metadata, &meta); err != nil || meta.Job != 7 {
			t.Fatalf("metadata %s: %v", i.Metadata, err)
		}
		if !i.ExpiresAt.Equal(a.ExpiresAt()) {
			t.Fatalf("ExpiresAt %v, lease says %v", i.ExpiresAt, a.ExpiresAt())
		}
	})

	t.Run("GetReleased", func(t *testing.T) {
		i, err := b.store.Get(ctx, "b")
		if err != nil || i.Held || i.Token != 1 || i.TimeLeft != 0 || i.Owner != [16]byte{} {
			t.Fatalf("Get = %+v, %v", i, err)
		}
	})

	t.Run("GetNotFound", func(t *testing.T) {
		if _, err := b.store.Get(ctx, "nope"); !errors.Is(err, lease.ErrNotFound) {
			t.Fatalf("err = %v, want ErrNotFound", err)
		}
	})

	t.Run("List", func(t *testing.T) {
		infos, err := b.store.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != 2 || infos[0].Name != "a" || infos[1].Name != "c" {
			t.Fatalf("List = %+v, want a and c", infos)
		}
	})

	t.Run("IsHeld", func(t *testing.T) {
		for name, want := range map[string]bool{"a": true, "b": false, "nope": false} {
			if got, err := b.store.IsHeld(ctx, name); err != nil || got != want {
				t.Errorf("IsHeld(%q) = %v, %v; want %v", name, got, err, want)
			}
		}
	})

	t.Run("BreakNotFound", func(t *testing.T) {
		if _, err := b.store.Break(ctx, "nope"); !errors.Is(err, lease.ErrNotFound) {
			t.Fatalf("err = %v, want ErrNotFound", err)
		}
	})
}

// TestBreakAcquisition: a conditional break frees only the acquisition it names.
// A stale token leaves the current holder alone (ErrNotHeld); the current
// one is broken — its Lease ends at once, the next token is higher — and
// a released acquisition is not broken again.
func TestBreakAcquisition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	first, err := b.store.TryAcquire(ctx, "bt", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := b.store.TryAcquire(ctx, "bt", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, stale := range []int64{first.Token(), l.Token() + 1} {
		if _, err := b.store.BreakAcquisition(ctx, "bt", l.Owner(), stale); !errors.Is(err, lease.ErrNotHeld) {
			t.Fatalf("BreakAcquisition(%d) with token %d holding: %v, want ErrNotHeld", stale, l.Token(), err)
		}
	}
	if _, err := b.store.BreakAcquisition(ctx, "bt", first.Owner(), l.Token()); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("BreakAcquisition with the right token and another owner: %v, want ErrNotHeld", err)
	}
	if l.Context().Err() != nil {
		t.Fatal("a break of another acquisition ended the holder's lease")
	}
	next, err := b.store.BreakAcquisition(ctx, "bt", l.Owner(), l.Token())
	if err != nil || next != l.Token()+1 {
		t.Fatalf("BreakAcquisition(%d): %d, %v; want %d", l.Token(), next, err, l.Token()+1)
	}
	select {
	case <-l.Lost():
	case <-ctx.Done():
		t.Fatal("the broken holder was not told")
	}
	if _, err := b.store.BreakAcquisition(ctx, "bt", l.Owner(), next); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("BreakAcquisition of a free row: %v, want ErrNotHeld", err)
	}
	if _, err := b.store.BreakAcquisition(ctx, "", l.Owner(), 1); err == nil {
		t.Fatal("BreakAcquisition with an empty name: no error")
	}
}
