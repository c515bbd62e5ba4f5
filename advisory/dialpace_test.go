package advisory_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// countingPool returns a lazy pool on dsn and a counter of its connection
// attempts (BeforeConnect runs once per attempt, for the Locker's sessions
// and listener too).
func countingPool(t testing.TB, dsn string) (*pgxpool.Pool, *atomic.Int64) {
	t.Helper()
	var dials atomic.Int64
	pool := lazyPool(t, dsn, func(c *pgxpool.Config) {
		c.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
			dials.Add(1)
			return nil
		}
	})
	return pool, &dials
}

// hammer runs n goroutines that TryLock and Unlock keys of their own,
// back to back, for d, and returns how many tries failed and the last
// error.
func hammer(t testing.TB, l *advisory.Locker, n int, d time.Duration) (failed int64, last error) {
	t.Helper()
	ctx := ctxT(t)
	var mu sync.Mutex
	var nfail atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for i := range n {
		key := pglocks.Int64Key(int64(1000 + i))
		wg.Go(func() {
			for time.Now().Before(end) {
				lk, err := l.TryLock(ctx, key)
				if err != nil {
					nfail.Add(1)
					mu.Lock()
					last = err
					mu.Unlock()
					continue
				}
				_ = lk.Unlock(ctx)
			}
		})
	}
	wg.Wait()
	return nfail.Load(), last
}

// TestSpreadDialsKeepBackoff: a healthy Locker whose role is at its
// connection limit (the session and the listener use both of its 2
// connections) does not try a new connection on every call to spread the
// load: the dials that only spread load keep the backoff (≤ 2/s at steady
// state). A call dials at once only when no session is open. Measured
// before: about 400 dials/s, each a backend forked and rejected (53300).
func TestSpreadDialsKeepBackoff(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	role := createRole(t, db)
	if _, err := db.Conn(t).Exec(ctxT(t), "alter role "+pgx.Identifier{role}.Sanitize()+" connection limit 2"); err != nil {
		t.Fatal(err)
	}
	pool, dials := countingPool(t, withUser(t, db.DSN, role, "right"))
	l := newLocker(t, pool, advisory.Config{})
	ctx := ctxT(t)
	lk, err := l.TryLock(ctx, pglocks.KeyOf("spread"))
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	const d = 2 * time.Second
	before := dials.Load()
	failed, last := hammer(t, l, 8, d)
	n := dials.Load() - before
	t.Logf("8 goroutines TryLock+Unlock for %v on a role at its connection limit: %d dials (%.0f/s), %d tries failed (last: %v)",
		d, n, float64(n)/d.Seconds(), failed, last)
	if failed > 0 {
		t.Errorf("%d tries failed on a healthy Locker (last: %v)", failed, last)
	}
	if n > 20 {
		t.Errorf("%d dials in %v, want ≤ 20: spreading load must not dial on every call", n, d)
	}
}
