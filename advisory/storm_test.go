package advisory_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
)

// countAdvisory counts the advisory locks held or awaited in the current
// database.
func countAdvisory(t testing.TB, q advisory.Querier) (held, waiting int) {
	t.Helper()
	rows, err := q.Query(context.Background(), `select granted, count(*) from pg_locks
		where locktype = 'advisory' and database = (select oid from pg_database where datname = current_database())
		group by granted`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var granted bool
		var n int
		if err := rows.Scan(&granted, &n); err != nil {
			t.Fatal(err)
		}
		if granted {
			held = n
		} else {
			waiting = n
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return held, waiting
}

func TestCancellationStorm(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := newLocker(t, b.pool, advisory.Config{ApplicationName: b.app})
	ctx := ctxT(t)
	key := pglocks.KeyOf("storm")
	// Open the lockers' sessions first, so that the storm is about
	// waiting, not about connecting.
	for _, l := range []*advisory.Locker{b.locker, other} {
		var locks []*advisory.Lock
		for i := range 3 {
			lk, err := l.Lock(ctx, pglocks.Int64Key(int64(i)))
			if err != nil {
				t.Fatal(err)
			}
			locks = append(locks, lk)
		}
		for _, lk := range locks {
			if err := lk.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	var acquired, timedOut atomic.Int64
	var wg sync.WaitGroup
	// 1,000 calls in waves of 50, so that the waves find the lock busy,
	// free, and being taken as their deadlines pass.
	for i := range 1000 {
		if i%50 == 0 {
			wg.Wait()
		}
		l := b.locker
		if i%2 == 1 {
			l = other
		}
		shared := i%5 == 0
		wg.Go(func() {
			d := time.Duration(rand.N(5 * int64(time.Millisecond)))
			cctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			var lk *advisory.Lock
			var err error
			if shared {
				lk, err = l.RLock(cctx, key)
			} else {
				lk, err = l.Lock(cctx, key)
			}
			switch {
			case err == nil:
				acquired.Add(1)
				if err := lk.Unlock(ctx); err != nil {
					t.Error(err)
				}
			case errors.Is(err, context.DeadlineExceeded):
				timedOut.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	t.Logf("storm: %d acquired, %d timed out", acquired.Load(), timedOut.Load())
	if timedOut.Load() == 0 {
		t.Error("no Lock timed out: the storm did not storm")
	}
	// Abandoned tries are undone by the sessions' workers; wait for them.
	waitFor(t, "no advisory lock held or awaited", 5*time.Second, func() bool {
		held, waiting := countAdvisory(t, b.pool)
		return held == 0 && waiting == 0
	})
	// The lockers still work, once the last undo's answer is in.
	for _, l := range []*advisory.Locker{b.locker, other} {
		waitFor(t, "TryLock after the storm", 5*time.Second, func() bool {
			lk, err := l.TryLock(ctx, key)
			if err != nil && !errors.Is(err, advisory.ErrLocked) {
				t.Fatalf("TryLock after the storm: %v", err)
			}
			return err == nil && lk.Unlock(ctx) == nil
		})
	}
}
