package advisory_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
)

func TestXactLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	for _, end := range []string{"Commit", "Rollback"} {
		t.Run("ReleasedAt"+end, func(t *testing.T) {
			key := pglocks.KeyOf("xact-" + end)
			tx, err := b.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if err := advisory.XactLock(ctx, tx, key); err != nil {
				t.Fatal(err)
			}
			if _, err := b.locker.TryLock(ctx, key); !errors.Is(err, advisory.ErrLocked) {
				t.Fatalf("session TryLock while a transaction holds the key: %v, want ErrLocked", err)
			}
			// Another transaction waits, and gets the key once tx ends.
			got := make(chan error, 1)
			go func() {
				got <- pgx.BeginFunc(ctx, b.pool, func(tx2 pgx.Tx) error {
					return advisory.XactLock(ctx, tx2, key)
				})
			}()
			if end == "Commit" {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-got:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("the key was not free after %s", end)
			}
			if held, err := advisory.IsHeld(ctx, b.pool, key); err != nil || held {
				t.Fatalf("IsHeld after %s = %v, %v", end, held, err)
			}
		})
	}
	t.Run("TrySharedAndExclusive", func(t *testing.T) {
		key := pglocks.PairKey(3, 4)
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			if err := advisory.TryXactRLock(ctx, tx, key); err != nil {
				return err
			}
			return pgx.BeginFunc(ctx, b.pool, func(tx2 pgx.Tx) error {
				if err := advisory.XactRLock(ctx, tx2, key); err != nil {
					return err
				}
				if err := advisory.TryXactLock(ctx, tx2, key); !errors.Is(err, advisory.ErrLocked) {
					t.Errorf("exclusive xact lock beside a shared one: %v, want ErrLocked", err)
				}
				return nil
			})
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("HonoursContext", func(t *testing.T) {
		key := pglocks.KeyOf("xact-ctx")
		lk, err := b.locker.Lock(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = lk.Unlock(ctx) }()
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		defer cancel()
		if err := advisory.XactLock(wctx, tx, key); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("XactLock on a held key = %v, want DeadlineExceeded", err)
		}
	})
}

// Ten thousand keys held at once live on the locker's few sessions.
func TestManyKeysFewConnections(t *testing.T) {
	t.Parallel()
	// QueryTimeout 7 s rather than 2 s, within the defaults' timing rule: a
	// batch slowed past 1 s by a loaded machine (seen through PgBouncer,
	// under -race beside a busy loop) would end its session and lose some
	// thousand locks, which is the loss detection working, not what this
	// test measures.
	b := setup(t, advisory.Config{QueryTimeout: 7 * time.Second})
	// 20 000 round trips: generous, for a loaded machine and for Docker
	// mode, whose round trips cross a bridge (2× loopback's here).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const n, workers = 10000, 8
	locks := make([]*advisory.Lock, n)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				lk, err := b.locker.TryLock(ctx, pglocks.Int64Key(int64(i)))
				if err != nil {
					t.Errorf("lock %d: %v", i, err)
					return
				}
				locks[i] = lk
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	held, _ := countAdvisory(t, b.pool)
	var conns int
	if err := b.pool.QueryRow(ctx, "select count(*) from pg_stat_activity where application_name = $1", b.app).Scan(&conns); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d keys held on %d server connections (sessions and listener)", held, conns)
	if held != n {
		t.Errorf("pg_locks shows %d advisory locks, want %d", held, n)
	}
	if conns > 4 {
		t.Errorf("%d server connections for %d held keys, want ≤ 4", conns, n)
	}
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				if err := locks[i].Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if held, _ := countAdvisory(t, b.pool); held != 0 {
		t.Errorf("%d advisory locks still held after unlocking all", held)
	}
}
