package lease_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/lease"
)

// A Release whose ctx ends while a keep-alive renewal of its lease is
// stuck (here behind a table lock) does not leave the row kept alive for
// good: the lease ends at once (ErrLost) and the release goes on in the
// background once the renewal is over (before the fix: the keep-alive
// resumed, and a caller that dropped the lease, as httplock does, leaked
// the row until the process ended).
func TestReleaseTimeoutDuringRenewal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	l := mustTry(t, b.store, "stuck", 3*time.Second, lease.WithKeepAlive())
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "lock table pglocks_leases in share mode"); err != nil {
		t.Fatal(err)
	}
	// Wait until a renewal is blocked behind the table lock.
	poll(t, 30*time.Second, "a renewal blocked on the table lock", func() bool {
		var n int
		err := b.pool.QueryRow(ctx, `select count(*) from pg_stat_activity
			where datname = current_database() and wait_event_type = 'Lock' and query ilike '%update%pglocks_leases%'`).Scan(&n)
		return err == nil && n > 0
	})
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	rerr := l.Release(rctx)
	cancel()
	if !errors.Is(rerr, lease.ErrLost) {
		t.Fatalf("Release = %v, want an error wrapping ErrLost", rerr)
	}
	waitFor(t, l.Lost(), time.Second, "the lease ending with its timed-out Release")
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	poll(t, 30*time.Second, "the row freed by the background release", func() bool {
		held, err := b.store.IsHeld(ctx, "stuck")
		return err == nil && !held
	})
}

// poll waits until cond holds, failing the test after d.
func poll(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, not synchronizing
	}
}

// The keep-alive's batched renewals are reported to Observer.Renew, as
// its doc says (before the fix, only Lease.Renew's were).
func TestKeepAliveReportsRenew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var n atomic.Int64
	s := newStore(t, b.pool, lease.Config{Observer: &pglocks.Observer{Renew: func(pglocks.RenewEvent) { n.Add(1) }}})
	l := mustTry(t, s, "reported", 3*time.Second, lease.WithKeepAlive()) // renewed every second
	exp := l.ExpiresAt()
	poll(t, 30*time.Second, "a keep-alive renewal", func() bool { return l.ExpiresAt().After(exp) })
	poll(t, 5*time.Second, "Observer.Renew called for it", func() bool { return n.Load() > 0 })
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}
