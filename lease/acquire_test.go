package lease_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/lease"
)

func TestTryAcquire(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)

	t.Run("FirstIsTokenOne", func(t *testing.T) {
		l := mustTry(t, b.store, "first", time.Minute)
		if l.Token() != 1 || l.Name() != "first" || l.Owner().Version() != 4 || l.TTL() != time.Minute {
			t.Fatalf("lease = %q %v token %d ttl %v", l.Name(), l.Owner(), l.Token(), l.TTL())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("HeldReportsHolder", func(t *testing.T) {
		l := mustTry(t, b.store, "held", time.Minute)
		_, err := b.store.TryAcquire(ctx, "held", time.Minute)
		var held *lease.HeldError
		if !errors.Is(err, lease.ErrHeld) || !errors.As(err, &held) {
			t.Fatalf("err = %v, want a *HeldError", err)
		}
		if held.Owner != l.Owner() || held.Token != l.Token() || held.Name != "held" {
			t.Fatalf("held = %+v, want owner %v token %d", held, l.Owner(), l.Token())
		}
		if held.ExpiresIn <= 50*time.Second || held.ExpiresIn > time.Minute {
			t.Fatalf("ExpiresIn = %v, want just under 1m", held.ExpiresIn)
		}
	})

	t.Run("SameOwnerDoesNotReenter", func(t *testing.T) {
		l := mustTry(t, b.store, "reenter", time.Minute)
		_, err := b.store.TryAcquire(ctx, "reenter", time.Minute, lease.WithOwner(l.Owner()))
		if !errors.Is(err, lease.ErrHeld) {
			t.Fatalf("err = %v, want ErrHeld", err)
		}
	})

	t.Run("StaleReclaim", func(t *testing.T) {
		// A crashed holder's row, crafted with an expiry in the past.
		crashed := uuid.New()
		exec(t, b.pool, `insert into pglocks_leases (name, owner, token, ttl, acquired_at, renewed_at, expires_at)
			values ('job:x', $1, 7, '30s', '2000-01-01', '2000-01-01', '2000-01-01')`, crashed)
		l := mustTry(t, b.store, "job:x", 30*time.Second)
		if l.Token() != 8 || l.Owner() == crashed {
			t.Fatalf("reclaimed with token %d owner %v, want token 8 and a new owner", l.Token(), l.Owner())
		}
	})

	t.Run("WithOwner", func(t *testing.T) {
		id := uuid.New()
		l := mustTry(t, b.store, "owned", time.Minute, lease.WithOwner(id))
		if l.Owner() != id {
			t.Fatalf("owner = %v, want %v", l.Owner(), id)
		}
	})
}

// TestTokensOnlyGrow checks that the token rises across release, expiry,
// takeover and Break.
func TestTokensOnlyGrow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	const name = "tokens"
	var last int64
	next := func(how string) *lease.Lease {
		t.Helper()
		l := mustTry(t, b.store, name, time.Minute)
		if l.Token() <= last {
			t.Fatalf("after %s: token %d, not above %d", how, l.Token(), last)
		}
		last = l.Token()
		return l
	}
	l := next("first acquire")
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l = next("release")
	expire(t, b.pool, name)
	l2 := next("expiry")
	if err := l.Renew(ctx); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("renew after takeover: %v, want ErrNotHeld", err)
	}
	tok, err := b.store.Break(ctx, name)
	if err != nil || tok != l2.Token()+1 {
		t.Fatalf("Break = %d, %v; want %d", tok, err, l2.Token()+1)
	}
	last = tok
	next("break")
}

// TestConcurrentTries races many first-ever and expired-row tries: exactly
// one wins each round, and every loser gets ErrHeld naming the winner.
func TestConcurrentTries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	for round := range 20 {
		name := "race"
		if round%2 == 0 {
			name = "race:" + uuid.NewString() // first-ever: the INSERT path
		} else {
			expire(t, b.pool, "race") // expired row: the UPDATE path
		}
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners []*lease.Lease
			helds   []*lease.HeldError
		)
		for range 16 {
			wg.Go(func() {
				l, err := b.store.TryAcquire(ctx, name, time.Minute)
				mu.Lock()
				defer mu.Unlock()
				var held *lease.HeldError
				switch {
				case err == nil:
					winners = append(winners, l)
				case errors.As(err, &held):
					helds = append(helds, held)
				default:
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if len(winners) != 1 {
			t.Fatalf("round %d: %d winners", round, len(winners))
		}
		for _, h := range helds {
			if h.Owner != winners[0].Owner() || h.Token != winners[0].Token() {
				t.Fatalf("round %d: HeldError %+v does not name the winner (token %d)", round, h, winners[0].Token())
			}
		}
	}
}

// TestFailedTryWritesNothing pins the cost model: a failed try takes no
// row lock (xmax unchanged) and assigns no transaction id (so writes no
// WAL), checked by replaying the exact statement inside a transaction.
func TestFailedTryWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	rec := &recorder{}
	pool := b.db.NewPool(t, rec.install)
	s := newStore(t, pool, lease.Config{})
	mustTry(t, b.store, "busy", time.Minute)
	var xmin, xmax string
	if err := b.pool.QueryRow(ctx, "select xmin::text, xmax::text from pglocks_leases where name = 'busy'", pgx.QueryExecModeExec).Scan(&xmin, &xmax); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryAcquire(ctx, "busy", time.Minute); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("err = %v, want ErrHeld", err)
	}
	sql, args := rec.last()
	if sql == "" {
		t.Fatal("the tracer saw no acquire statement")
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()
	var xid *string
	if err := tx.QueryRow(ctx, "select pg_current_xact_id_if_assigned()::text").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	if xid != nil {
		t.Errorf("a failed try assigned transaction id %s: it wrote", *xid)
	}
	var xmin2, xmax2 string
	if err := tx.QueryRow(ctx, "select xmin::text, xmax::text from pglocks_leases where name = 'busy'").Scan(&xmin2, &xmax2); err != nil {
		t.Fatal(err)
	}
	if xmin2 != xmin || xmax2 != xmax {
		t.Errorf("row xmin/xmax went from %s/%s to %s/%s: the failed try touched it", xmin, xmax, xmin2, xmax2)
	}
}

func TestAcquireWaitsForRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	holder := mustTry(t, b.store, "wait", time.Hour)
	got := make(chan *lease.Lease)
	go func() {
		l, err := b.store.Acquire(ctx, "wait", time.Minute)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitWaiting(t, b, "wait")
	start := time.Now()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := <-got
	if l == nil {
		t.FailNow()
	}
	// With an hour left on the holder's lease, only the NOTIFY can have
	// woken the waiter.
	t.Logf("release → acquired in %v", time.Since(start))
	if l.Token() != holder.Token()+1 {
		t.Fatalf("token %d, want %d", l.Token(), holder.Token()+1)
	}
}

func TestAcquireWakesAtExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	// A crashed holder: its lease runs out in 300 ms and nobody releases it.
	start := time.Now()
	mustTry(t, b.store, "crashed", 300*time.Millisecond)
	l, err := b.store.Acquire(ctx, "crashed", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 300*time.Millisecond || el > 5*time.Second {
		t.Fatalf("acquired after %v, want about 300ms", el)
	}
	if l.Token() != 2 {
		t.Fatalf("token %d", l.Token())
	}
}

func TestAcquireCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mustTry(t, b.store, "busy", time.Hour)
	ctx, cancel := context.WithCancel(ctxT(t))
	errc := make(chan error)
	go func() {
		_, err := b.store.Acquire(ctx, "busy", time.Minute)
		errc <- err
	}()
	waitWaiting(t, b, "busy")
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

// waitWaiting waits until an Acquire of name is registered with the
// store's listener (it may still be on its way to the select).
func waitWaiting(t *testing.T, b bundle, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for lease.Waiters(b.store, name) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no Acquire is waiting")
		}
		runtime.Gosched()
	}
}
