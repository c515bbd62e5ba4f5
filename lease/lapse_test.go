package lease_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// jumpClock is a Config.Now that runs with time.Now plus an offset the test
// moves: a process the scheduler stalled past a deadline, without the wait.
type jumpClock struct{ off atomic.Int64 }

func (c *jumpClock) now() time.Time       { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *jumpClock) jump(d time.Duration) { c.off.Add(int64(d)) }
func (c *jumpClock) config() lease.Config { return lease.Config{Now: c.now} }

// TestLapsedTrustIsFinal: once TrustedUntil has returned a passed deadline,
// the lease is lost, and a renewal answered afterwards does not revive it
// (on a stalled scheduler the renewal's reply can be handled before the
// timer's callback, which found the deadline moved and let the lease go
// on, trusted again, although its holder had read the lapse). The clock
// jumps past the deadline without the wait.
func TestLapsedTrustIsFinal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var clk jumpClock
	s := newStore(t, b.pool, clk.config())
	l := mustTry(t, s, "lapse", time.Minute)
	clk.jump(2 * time.Minute) // past the trust deadline, not the server's expiry
	if !clk.now().After(l.TrustedUntil()) {
		t.Fatalf("trusted until %v, now %v: the jump did not pass the deadline", l.TrustedUntil(), clk.now())
	}
	err := l.Renew(ctxT(t))
	if !errors.Is(err, lease.ErrLost) {
		t.Fatalf("Renew after the trust deadline: %v, want ErrLost; trusted until %v, now %v", err, l.TrustedUntil(), clk.now())
	}
	waitFor(t, l.Lost(), time.Second, "Lost")
	// The renewal did extend the row; Release frees it.
	if err := l.Release(ctxT(t)); err != nil && !errors.Is(err, lease.ErrLost) {
		t.Fatal(err)
	}
	if _, err := s.TryAcquire(ctxT(t), "lapse", time.Minute); err != nil {
		t.Fatalf("after the release: %v", err)
	}
}
