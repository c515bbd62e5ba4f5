package lease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"
	"github.com/pglocks/pglocks/lease"
)

// TestCloseRacesAcquisitions: acquisitions racing Store.Close
// either return a live *Lease (whose row Close leaves held, as documented)
// or an error — and then hold nothing: a row they took is released before
// they return. 40 acquisitions per round, TTL 1 h, Close after 0–3 ms.
// In CallerGaveUp the callers' ctx ends at the moment of Close, so the
// release of a row taken just before Close cannot run on the caller's ctx:
// it must go on in the background, and Close waits for it.
func TestCloseRacesAcquisitions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, gaveUp := range []bool{false, true} {
		t.Run(map[bool]string{false: "CallerWaits", true: "CallerGaveUp"}[gaveUp], func(t *testing.T) {
			var got, failed, leaked int
			for r := range 10 {
				g, f, l := closeRace(t, b, fmt.Sprintf("%v-r%d", gaveUp, r), gaveUp)
				got, failed, leaked = got+g, failed+f, leaked+l
			}
			t.Logf("%d acquisitions returned a lease before Close, %d an error", got, failed)
			if leaked > 0 {
				t.Errorf("%d rows held by acquisitions whose caller got an error", leaked)
			}
		})
	}
}

// closeRace runs one round of TestCloseRacesAcquisitions: 40 acquisitions
// of distinct names, then Close. It returns how many returned a lease, how
// many an error, and how many of the latter left their row held.
func closeRace(t *testing.T, b bundle, prefix string, cancelCallers bool) (got, failed, leaked int) {
	ctx := ctxT(t)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := lease.New(b.pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		leases = make(map[string]bool)
	)
	for c := range 40 {
		name := fmt.Sprintf("%s-%d", prefix, c)
		wg.Go(func() {
			var err error
			if c%2 == 0 {
				_, err = s.TryAcquire(cctx, name, time.Hour)
			} else {
				_, err = s.Acquire(cctx, name, time.Hour)
			}
			mu.Lock()
			leases[name] = err == nil
			mu.Unlock()
		})
	}
	time.Sleep(time.Duration(rand.N(3000)) * time.Microsecond) // the race itself, not synchronization
	if cancelCallers {
		cancel()
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for name, ok := range leases {
		held, err := b.store.IsHeld(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			got++
		} else {
			failed++
		}
		if held && !ok {
			if leaked++; leaked <= 3 {
				t.Errorf("%s: the caller got an error, but the row is held", name)
			}
		}
	}
	return got, failed, leaked
}

// TestSerializableDatabase: with default_transaction_isolation
// = serializable, racing acquisitions meet serialization failures; they are
// retried, so 8 contenders doing Acquire + Release meet no error.
func TestSerializableDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	exec(t, b.pool, "alter database "+pgx.Identifier{b.db.Name}.Sanitize()+" set default_transaction_isolation = 'serializable'")
	pool := b.db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 10 })
	var iso string
	if err := pool.QueryRow(ctx, "show default_transaction_isolation").Scan(&iso); err != nil || iso != "serializable" {
		t.Fatalf("isolation %q, %v", iso, err)
	}
	s := newStore(t, pool, lease.Config{})
	var (
		wg          sync.WaitGroup
		pairs, errs atomic.Int64
		firstErr    atomic.Value
	)
	deadline := time.Now().Add(2 * time.Second)
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				l, err := s.Acquire(ctx, "hot", time.Minute)
				if err == nil {
					err = l.Release(ctx)
				}
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				pairs.Add(1)
			}
		})
	}
	wg.Wait()
	t.Logf("%d acquire+release pairs, %d errors", pairs.Load(), errs.Load())
	if errs.Load() > 0 {
		t.Fatalf("%d errors, e.g. %v", errs.Load(), firstErr.Load())
	}
}

// TestAcquireClosedPool: a closed pool is fatal at once; a
// waiting Acquire does not retry it until its ctx ends.
func TestAcquireClosedPool(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool := b.db.NewPool(t)
	s := newStore(t, pool, lease.Config{})
	// Held until the pool has closed (a TTL that could run out first
	// failed at load 10); its release then wakes the waiter, which tries
	// again, on the closed pool.
	busy := mustTry(t, b.store, "busy", time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctx, "busy", time.Minute)
		errc <- err
	}()
	waitParked(t, s)
	pool.Close()
	if err := busy.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	select {
	case err := <-errc:
		if !errors.Is(err, puddle.ErrClosedPool) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire on a closed pool: %v, want closed pool", err)
		}
		t.Logf("returned %v after the release: %v", time.Since(start), err)
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire on a closed pool still waiting or retrying 5s after the release")
	}
}

// TestAcquireFirstTryTransient: a session that died
// before Acquire's first try (here: its backend terminated while idle in
// the pool) is retried like any later failure, not returned.
func TestAcquireFirstTryTransient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	pool := b.db.NewPool(t, func(c *pgxpool.Config) {
		c.MaxConns, c.MinConns = 1, 1
		c.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	})
	s := newStore(t, pool, lease.Config{})
	for i := range 3 {
		var pid uint32
		if err := pool.QueryRow(ctx, "select pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		if err := b.db.Server.TerminateBackend(ctx, pid); err != nil {
			t.Fatal(err)
		}
		l, err := s.Acquire(ctx, "t"+strconv.Itoa(i), time.Minute)
		if err != nil {
			t.Fatalf("Acquire after the session died: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSerializableCtxEnds: when ctx ends while an acquisition backs off
// after a serialization failure, the caller is told that ctx ended (with
// the serialization failure as the last error), not just handed a 40001
// it might mistake for a failure worth reporting.
func TestSerializableCtxEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	exec(t, b.pool, "alter database "+pgx.Identifier{b.db.Name}.Sanitize()+" set default_transaction_isolation = 'serializable'")
	pool := b.db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 10 })
	s := newStore(t, pool, lease.Config{})
	var (
		wg       sync.WaitGroup
		bad      atomic.Int64
		firstBad atomic.Value
		ended    atomic.Int64
	)
	deadline := time.Now().Add(2 * time.Second)
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				actx, cancel := context.WithTimeout(ctx, time.Duration(1+rand.N(5))*time.Millisecond)
				l, err := s.TryAcquire(actx, "hot", time.Minute)
				if err == nil {
					err = l.Release(ctx)
				}
				cancel()
				var pgErr *pgconn.PgError
				switch {
				case errors.Is(err, context.DeadlineExceeded):
					ended.Add(1)
				case errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01"):
					// A serialization failure returned bare: the backoff
					// after it was cut by ctx, and ctx's error was lost.
					bad.Add(1)
					firstBad.CompareAndSwap(nil, err)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d calls ended by their ctx", ended.Load())
	if bad.Load() > 0 {
		t.Fatalf("%d errors that do not say ctx ended, e.g. %v", bad.Load(), firstBad.Load())
	}
}
