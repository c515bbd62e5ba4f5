package lease_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// TestBreakEndsHolderPromptly (loss is announced): a Break reaches the holding store through NOTIFY and ends
// the Lease at once, not at its next renewal (TTL 30 s: 10 s away). Five
// rounds; each must close Lost within 1 s of Break returning.
func TestBreakEndsHolderPromptly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	holder := newStore(t, b.db.NewPool(t), lease.Config{})
	var lat []time.Duration
	for range 5 {
		l := mustTry(t, holder, "brk", 30*time.Second, lease.WithKeepAlive())
		// Let the holder's store listen before the Break: a lease taken
		// by a store with no listener yet is checked by its keep-alive.
		eventually(t, 10*time.Second, "the holder's listener", func() bool { return lease.Listening(holder) })
		if _, err := b.store.Break(ctx, "brk"); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		select {
		case <-l.Lost():
			lat = append(lat, time.Since(start))
		case <-time.After(time.Second):
			t.Fatalf("holder not told within 1s of a Break (Err %v)", l.Err())
		}
	}
	slices.Sort(lat)
	t.Logf("Break → holder's Lost closed: p50 %v, max %v", lat[len(lat)/2], lat[len(lat)-1])
}

// TestTakeoverEndsHolderPromptly: a takeover of a row that expired by the
// server clock (here: expired by hand while the holder trusts it for an
// hour) ends the old Lease at once — whether the taker runs the full
// acquire statement (a name it never saw) or the retake (it saw a token
// of the name: here in a failed try first).
func TestTakeoverEndsHolderPromptly(t *testing.T) {
	t.Parallel()
	for _, seen := range []bool{false, true} {
		t.Run(fmt.Sprintf("seen=%v", seen), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := ctxT(t)
			holder := newStore(t, b.db.NewPool(t), lease.Config{})
			l := mustTry(t, holder, "tk", time.Hour)
			eventually(t, 10*time.Second, "the holder's listener", func() bool { return lease.Listening(holder) })
			if seen {
				if _, err := b.store.TryAcquire(ctx, "tk", time.Minute); !errors.Is(err, lease.ErrHeld) {
					t.Fatalf("first try: %v, want ErrHeld", err)
				}
			}
			expire(t, b.pool, "tk")
			if _, err := b.store.TryAcquire(ctx, "tk", time.Minute); err != nil {
				t.Fatal(err)
			}
			waitFor(t, l.Lost(), time.Second, "the old holder's loss after a takeover")
		})
	}
}

// TestKeepAliveRechecks: a loss nobody announces (the row changed by hand,
// no NOTIFY) is noticed by a kept-alive lease within its check interval
// (default 5 s), whatever its TTL.
func TestKeepAliveRechecks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := mustTry(t, b.store, "rc", time.Hour, lease.WithKeepAlive())
	exec(t, b.pool, "update pglocks_leases set owner = null, token = token + 1 where name = 'rc'")
	start := time.Now()
	waitFor(t, l.Lost(), 10*time.Second, "the loss")
	t.Logf("unannounced loss noticed after %v", time.Since(start))
}
