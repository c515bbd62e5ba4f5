package lease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// TestResumeLiveLease: Resume of an acquisition
// that this store holds as a live Lease returns that Lease, renewed — not
// a second Lease of the same acquisition. Releasing it through either
// reference then ends it for both, before another client can take the
// name (before the fix: the first Lease stayed trusted while another
// store held the name).
func TestResumeLiveLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	l := mustTry(t, b.store, "live", time.Minute)
	trusted := l.TrustedUntil()
	l2, err := b.store.Resume(ctx, l.Handle())
	if err != nil {
		t.Fatal(err)
	}
	if l2 != l {
		t.Errorf("Resume of a live Lease's handle made a second Lease of one acquisition")
	}
	if !l2.TrustedUntil().After(trusted) {
		t.Errorf("Resume did not renew: trusted until %v, was %v", l2.TrustedUntil(), trusted)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	other := newStore(t, b.pool, lease.Config{})
	mustTry(t, other, "live", time.Minute)
	if l.Err() == nil {
		t.Fatalf("another store holds the name and the first Lease is still trusted (Err %v)", l.Err())
	}
}

// TestResumeLiveStartsKeepAlive: WithKeepAlive on a Resume of a live
// Lease without keep-alive starts its keep-alive.
func TestResumeLiveStartsKeepAlive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	l := mustTry(t, b.store, "ka", 900*time.Millisecond)
	l2, err := b.store.Resume(ctx, l.Handle(), lease.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	exp := l2.ExpiresAt()
	eventually(t, 30*time.Second, "a keep-alive renewal", func() bool { return l2.ExpiresAt().After(exp) })
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestResumeWhileReleasing: an acquisition whose release this store runs
// in the background (its Release was not sent) is not resumed here: the
// background release would free the row under the resumed Lease.
func TestResumeWhileReleasing(t *testing.T) {
	t.Parallel()
	o := newOutage(t)
	s := newStore(t, o.pool, lease.Config{})
	ctx := ctxT(t)
	l := mustTry(t, s, "releasing", time.Minute)
	o.begin(t, ctx)
	if err := l.Release(ctx); !errors.Is(err, lease.ErrReleased) {
		t.Fatalf("Release during the outage = %v, want ErrReleased (in the background)", err)
	}
	if _, err := s.Resume(ctx, l.Handle()); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Resume of an acquisition being released = %v, want ErrNotHeld", err)
	}
	o.end(t)
	o.waitReleased(t, "releasing", 10*time.Second)
}
