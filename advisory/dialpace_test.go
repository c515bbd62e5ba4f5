package advisory_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
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

// storm is what hammer saw: the tries that failed, the last error, and of
// the errors those that do not say they are an earlier dial's, and the
// greatest age of those that say "ended … before this call".
type storm struct {
	failed, unmarked int64
	last             error
	oldest           time.Duration
}

// hammer runs n goroutines that TryLock and Unlock keys of their own,
// back to back, for d.
func hammer(t testing.TB, l *advisory.Locker, n int, d time.Duration) storm {
	t.Helper()
	ctx := ctxT(t)
	var mu sync.Mutex
	var st storm
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for i := range n {
		key := pglocks.Int64Key(int64(1000 + i))
		wg.Go(func() {
			for time.Now().Before(end) {
				lk, err := l.TryLock(ctx, key)
				if err == nil {
					_ = lk.Unlock(ctx)
					continue
				}
				age, marked := staleAge(t, err)
				mu.Lock()
				st.failed, st.last = st.failed+1, err
				if !marked {
					st.unmarked++
				}
				st.oldest = max(st.oldest, age)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return st
}

// staleAge returns how long before the call the dial whose error err is
// ended ("the error of a dial that ended X before this call"), and
// whether err says that it, or the dial's start, was before the call.
func staleAge(t testing.TB, err error) (time.Duration, bool) {
	msg := err.Error()
	const ended = "the error of a dial that ended "
	i := strings.Index(msg, ended)
	if i < 0 {
		return 0, strings.Contains(msg, "before this call")
	}
	f := strings.Fields(msg[i+len(ended):])
	age, perr := time.ParseDuration(f[0])
	if perr != nil {
		t.Errorf("cannot read the age in %q: %v", msg, perr)
	}
	return age, true
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
	st := hammer(t, l, 8, d)
	n := dials.Load() - before
	t.Logf("8 goroutines TryLock+Unlock for %v on a role at its connection limit: %d dials (%.0f/s), %d tries failed (last: %v)",
		d, n, float64(n)/d.Seconds(), st.failed, st.last)
	if st.failed > 0 {
		t.Errorf("%d tries failed on a healthy Locker (last: %v)", st.failed, st.last)
	}
	if n > 20 {
		t.Errorf("%d dials in %v, want ≤ 20: spreading load must not dial on every call", n, d)
	}
}

// TestTryLockStormDialsPaced: 8 goroutines trying TryLock in a tight loop
// against a port where nothing listens make a dial at most every
// RedialAfter (25 ms) or so, not one per call (measured before: over
// 6,000 dials/s, most of a core); a try that returns the error of a dial
// that ended before the call began says so, and that dial ended less than
// RedialAfter before.
func TestTryLockStormDialsPaced(t *testing.T) {
	t.Parallel()
	pool, dials := countingPool(t, "postgres://postgres@"+closedAddr(t)+"/x?sslmode=disable")
	l := newLocker(t, pool, advisory.Config{Logger: slog.New(slog.DiscardHandler)})
	const d = 2 * time.Second
	st := hammer(t, l, 8, d)
	n := dials.Load()
	t.Logf("8 goroutines TryLock in a tight loop for %v against a closed port: %d dials (%.0f/s), %d tries failed, %d with the error of their own dial, the oldest error %v old (last: %v)",
		d, n, float64(n)/d.Seconds(), st.failed, st.unmarked, st.oldest, st.last)
	if st.failed > st.unmarked && st.oldest == 0 {
		t.Errorf("no error says it is the error of a dial that ended before the call")
	}
	if rate := float64(n) / d.Seconds(); rate > 100 {
		t.Errorf("%.0f dials/s, want < 100", rate)
	}
	if st.last == nil || !strings.Contains(st.last.Error(), "refused") {
		t.Errorf("last error = %v, want the dial's cause", st.last)
	}
	if errors.Is(st.last, advisory.ErrLocked) {
		t.Errorf("a dial error is reported as ErrLocked: %v", st.last)
	}
	if st.oldest > advisory.RedialAfter { // the age is rounded to the µs
		t.Errorf("a try returned the error of a dial that ended %v before it, want < %v", st.oldest, advisory.RedialAfter)
	}
}
