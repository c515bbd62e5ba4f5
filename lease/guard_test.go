package lease_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
)

// guardedIncrement adds one to the counter row inside a transaction guarded
// by l; the write also refuses a token lower than the last one it saw, as a
// fenced resource would.
func guardedIncrement(ctx context.Context, pool *pgxpool.Pool, l *lease.Lease) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := l.Guard(ctx, tx); err != nil {
			return err
		}
		// QueryExecModeExec: the pool may be behind a transaction-mode
		// pooler, where a statement prepared in an earlier transaction may
		// be on another server session.
		tag, err := tx.Exec(ctx, "update counter set n = n + 1, last_token = $1 where last_token < $1", pgx.QueryExecModeExec, l.Token())
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return errors.New("fencing token went backwards")
		}
		return nil
	})
}

func counterSetup(t *testing.T) bundle {
	b := setup(t)
	exec(t, b.pool, "create table counter (n bigint not null, last_token bigint not null); insert into counter values (0, 0)")
	return b
}

func TestGuardStaleHolder(t *testing.T) {
	t.Parallel()
	b := counterSetup(t)
	ctx := ctxT(t)
	old := mustTry(t, b.store, "res", time.Minute)
	expire(t, b.pool, "res")
	cur := mustTry(t, b.store, "res", time.Minute)
	if err := guardedIncrement(ctx, b.pool, old); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("stale holder's guarded write: %v, want ErrNotHeld", err)
	}
	if err := guardedIncrement(ctx, b.pool, cur); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Break(ctx, "res"); err != nil {
		t.Fatal(err)
	}
	if err := guardedIncrement(ctx, b.pool, cur); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("guarded write after Break: %v, want ErrNotHeld", err)
	}
	var n int
	if err := b.pool.QueryRow(ctx, "select n from counter", pgx.QueryExecModeExec).Scan(&n); err != nil || n != 1 {
		t.Fatalf("counter = %d, %v; want 1", n, err)
	}
}

// TestTakeoverWaitsForGuard: neither Break nor a takeover after expiry can
// commit while a transaction guarded by the old lease is open.
func TestTakeoverWaitsForGuard(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"Break", "Expiry"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := ctxT(t)
			ttl := time.Minute
			if how == "Expiry" {
				ttl = 300 * time.Millisecond
			}
			l := mustTry(t, b.store, "res", ttl)
			tx, err := b.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.WithoutCancel(ctx))
			if err := l.Guard(ctx, tx); err != nil {
				t.Fatal(err)
			}
			done := make(chan int64, 1)
			go func() {
				defer close(done)
				if how == "Break" {
					tok, err := b.store.Break(ctx, "res")
					if err != nil {
						t.Error(err)
					}
					done <- tok
					return
				}
				nl, err := b.store.Acquire(ctx, "res", time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				done <- nl.Token()
			}()
			waitLockWait(t, b)
			select {
			case <-done:
				t.Fatal("took over while a guarded transaction was open")
			default:
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case tok := <-done:
				if tok <= l.Token() {
					t.Fatalf("new token %d not above %d", tok, l.Token())
				}
			case <-time.After(10 * time.Second):
				t.Fatal("takeover did not proceed after the guarded commit")
			}
		})
	}
}

// waitLockWait waits until some session of the test database waits for a
// row lock.
func waitLockWait(t *testing.T, b bundle) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		err := b.pool.QueryRow(context.Background(), `select count(*) from pg_stat_activity
			where datname = current_database() and wait_event_type = 'Lock'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("nobody waits for the guarded row")
		}
		runtime.Gosched()
	}
}

// TestGuardedCounterStress: 32 goroutines × 250 attempts (a quarter of them
// waiting ones) on one name with random hold times, some with the shortest
// TTL (lease.MinTTL), of which one in 32 holds past it so that it expires
// mid-hold. The
// counter, written only under Guard, ends equal to the number of committed
// guarded writes, tokens reach it in order, and no two long-TTL holders
// ever coexist.
//
// It does not run in parallel with other tests: it saturates the server,
// and would starve their timing-sensitive parts (keep-alives, waits).
func TestGuardedCounterStress(t *testing.T) {
	if testing.Short() {
		t.Skip("stress test")
	}
	b := counterSetup(t)
	pool := b.db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 48 })
	s := newStore(t, pool, lease.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // slow under -race
	defer cancel()
	var (
		committed, acquired, stale atomic.Int64
		maxWait                    atomic.Int64 // longest Acquire, ns
		holders                    atomic.Int32
		wg                         sync.WaitGroup
	)
	for range 32 {
		wg.Go(func() {
			for range 250 { // 8,000 acquisitions: ~10 s on 2 cores under -race
				ttl, long := lease.MinTTL, false
				if rand.N(10) > 0 {
					ttl, long = 10*time.Second, true
				}
				var (
					l   *lease.Lease
					err error
				)
				if rand.N(4) == 0 { // a quarter of the attempts wait
					actx, cancel := context.WithTimeout(ctx, 30*time.Second)
					start := time.Now()
					l, err = s.Acquire(actx, "hot", ttl)
					cancel()
					maxWait.Store(max(maxWait.Load(), int64(time.Since(start))))
				} else {
					l, err = s.TryAcquire(ctx, "hot", ttl)
				}
				if errors.Is(err, lease.ErrHeld) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				acquired.Add(1)
				if long && holders.Add(1) != 1 {
					t.Error("two holders at once")
				}
				hold := time.Duration(rand.N(200)) * time.Microsecond
				if !long && rand.N(32) == 0 {
					hold = ttl + 10*time.Millisecond // work that outlives the lease
				}
				spin(hold)
				err = guardedIncrement(ctx, pool, l)
				switch {
				case err == nil:
					committed.Add(1)
				case errors.Is(err, lease.ErrNotHeld) && !long:
					stale.Add(1)
				default:
					t.Error(err)
				}
				if long {
					holders.Add(-1)
				}
				if err := l.Release(ctx); err != nil && (long || !errors.Is(err, lease.ErrNotHeld)) {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	var n, last int64
	if err := b.pool.QueryRow(ctx, "select n, last_token from counter", pgx.QueryExecModeExec).Scan(&n, &last); err != nil {
		t.Fatal(err)
	}
	info, err := s.Get(ctx, "hot")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d acquisitions, %d guarded writes committed, %d refused as stale, last token %d; longest Acquire %v",
		acquired.Load(), committed.Load(), stale.Load(), info.Token, time.Duration(maxWait.Load()))
	if n != committed.Load() {
		t.Fatalf("counter = %d, want %d", n, committed.Load())
	}
	if info.Token != acquired.Load() {
		t.Fatalf("last token %d, want one per acquisition (%d)", info.Token, acquired.Load())
	}
}

// spin holds the CPU-light way for d, standing in for work under a lease.
func spin(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
		runtime.Gosched()
	}
}
