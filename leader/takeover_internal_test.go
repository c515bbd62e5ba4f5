package leader

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// TestOutwaitBreaksOnlyTheTermItWaitedFor: a session-mode taker that has
// outwaited the horizon of the holder it read breaks that holder's term
// only. If the lease changed hands meanwhile — here a lease-only candidate
// took it, as it may once the old lease expired or was released — the new
// term is left alone (Store.Break, which breaks whoever holds the lease,
// would break it), and the taker tries again.
func TestOutwaitBreaksOnlyTheTermItWaitedFor(t *testing.T) {
	t.Parallel()
	e, _, _ := newInternal(t, "outwait")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	store := e.cfg.Store
	md, _ := json.Marshal(meta{Identity: "old", SessionPID: 1, Grace: "100ms"})
	old, err := store.TryAcquire(ctx, e.leaseName, time.Minute, lease.WithMetadata(md))
	if err != nil {
		t.Fatal(err)
	}
	info, err := store.Get(ctx, e.leaseName)
	if err != nil {
		t.Fatal(err)
	}
	holder := leaderFromInfo(e.cfg.Name, info) // what the taker read
	if err := old.Release(ctx); err != nil {
		t.Fatal(err)
	}
	taken, err := store.TryAcquire(ctx, e.leaseName, time.Minute, lease.WithMetadata(e.metadata(nil)))
	if err != nil {
		t.Fatal(err)
	}
	lk, err := e.cfg.Locker.Lock(ctx, e.key)
	if err != nil {
		t.Fatal(err)
	}
	defer e.unlock(lk)
	// The holder's horizon has long passed since the lock was taken.
	ls, err := e.outwait(ctx, lk, time.Now().Add(-time.Minute), holder, e.termOptions(lk))
	if ls != nil || err != nil {
		t.Fatalf("outwait = %v, %v; want nil, nil (try again)", ls, err)
	}
	if err := taken.Renew(ctx); err != nil {
		t.Fatalf("the lease-only term %d after outwait: %v", taken.Token(), err)
	}
	// The term it waited for is broken, and the next term is higher still.
	broken, err := e.breakTerm(ctx, leaderFromInfo(e.cfg.Name, lease.Info{Owner: taken.Owner(), Token: taken.Token()}))
	if err != nil || !broken {
		t.Fatalf("breakTerm of the live term: %v, %v", broken, err)
	}
	if err := taken.Renew(ctx); !errors.Is(err, lease.ErrNotHeld) && !errors.Is(err, lease.ErrLost) {
		t.Fatalf("renewal of a broken term: %v", err)
	}
	next, err := store.TryAcquire(ctx, e.leaseName, time.Minute)
	if err != nil || next.Token() <= taken.Token()+1 {
		t.Fatalf("after the break: %v, %v; want a token above %d", next, err, taken.Token()+1)
	}
}
