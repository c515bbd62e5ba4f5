package lease_test

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// newCluster starts a cluster whose databases have the lease table, and
// returns a pool on a fresh database through the multi-host DSN.
func newCluster(t *testing.T, opts ...pgtest.Option) (*pgtest.Cluster, *pgtest.DB, *pgxpool.Pool) {
	t.Helper()
	opts = append(opts, pgtest.WithTemplate(func(ctx context.Context, conn *pgx.Conn) error {
		ddl, err := lease.SchemaSQL(lease.Config{})
		if err != nil {
			return err
		}
		_, err = conn.Exec(ctx, ddl)
		return err
	}))
	c := pgtest.NewCluster(t, opts...)
	db := c.NewDB(t)
	return c, db, db.NewPool(t)
}

// churn is a workload of stores (one per simulated process) acquiring and
// releasing one name, each as fast as it can, recording every
// acknowledged acquisition.
type churn struct {
	mu       sync.Mutex
	acked    []ack
	refused  atomic.Int64 // RegressionErrors
	failed   atomic.Int64 // other errors than ErrHeld (outage, unknown)
	promoted atomic.Bool
	stopped  time.Time // when the primary's immediate stop began
}

type ack struct {
	store int
	token int64
	after bool      // acknowledged after Promote returned
	at    time.Time // when it was acknowledged
}

// run runs stores until ctx ends; call it in a goroutine per store.
func (w *churn) run(ctx context.Context, id int, s *lease.Store) {
	for ctx.Err() == nil {
		after := w.promoted.Load()
		l, err := s.TryAcquire(ctx, "ha", 2*time.Second)
		switch {
		case err == nil:
			w.mu.Lock()
			w.acked = append(w.acked, ack{id, l.Token(), after && w.promoted.Load(), time.Now()})
			w.mu.Unlock()
			_ = l.Release(ctx)
			continue
		case errors.Is(err, lease.ErrTokenRegressed):
			w.refused.Add(1)
		case !errors.Is(err, lease.ErrHeld):
			w.failed.Add(1)
		}
		select { // pace retries; not a synchronization
		case <-ctx.Done():
		case <-time.After(time.Millisecond):
		}
	}
}

func (w *churn) count(after bool) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, a := range w.acked {
		if a.after == after {
			n++
		}
	}
	return n
}

// failover runs the churn on n stores, promotes the standby once each
// side has at least min acknowledged acquisitions, and returns once as many
// have been acknowledged after the promotion.
func (w *churn) failover(t *testing.T, c *pgtest.Cluster, pool *pgxpool.Pool, n, min int) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range n {
		s := newStore(t, pool, lease.Config{})
		wg.Add(1)
		go func() { defer wg.Done(); w.run(wctx, i, s) }()
	}
	defer func() { stop(); wg.Wait() }()
	wait(t, ctx, "acquisitions before the failover", func() bool { return w.count(false) >= min })
	w.mu.Lock()
	w.stopped = time.Now()
	w.mu.Unlock()
	took, err := c.Promote(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w.promoted.Store(true)
	wait(t, ctx, "acquisitions after the failover", func() bool { return w.count(true) >= min })
	return took
}

// duplicates returns the tokens acknowledged more than once, and how many
// of them were acknowledged twice to the same store.
func (w *churn) duplicates() (tokens []int64, sameStore int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	by := map[int64][]int{}
	for _, a := range w.acked {
		by[a.token] = append(by[a.token], a.store)
	}
	for tok, stores := range by {
		if len(stores) < 2 {
			continue
		}
		tokens = append(tokens, tok)
		seen := map[int]bool{}
		for _, s := range stores {
			if seen[s] {
				sameStore++
			}
			seen[s] = true
		}
	}
	sort.Slice(tokens, func(i, j int) bool { return tokens[i] < tokens[j] })
	return tokens, sameStore
}

// lost estimates how many acquisitions acknowledged before the stop the
// failover lost: those whose token the new primary handed out again,
// judged by the lowest token acknowledged after the stop: a lower bound,
// exact when the new primary's first acquisition was acknowledged (a
// refused regression raises the counter past the lost tokens).
func (w *churn) lost() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	first := int64(-1)
	for _, a := range w.acked {
		if a.at.After(w.stopped) && (first < 0 || a.token < first) {
			first = a.token
		}
	}
	n := 0
	for _, a := range w.acked {
		if a.at.Before(w.stopped) && first >= 0 && a.token >= first {
			n++
		}
	}
	return n
}

// wait polls cond until it holds or ctx ends.
func wait(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for delay := time.Millisecond; !cond(); delay = min(2*delay, 50*time.Millisecond) {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(delay):
		}
	}
}

// TestFailoverSync fails over to a synchronous standby while four stores
// acquire and release one lease as fast as they can, so acquisitions are in
// flight at the immediate stop: no acknowledged acquisition is lost (the
// new primary's counter is at least the highest acknowledged token) and no
// token is acknowledged twice; no store sees a regression.
func TestFailoverSync(t *testing.T) {
	t.Parallel()
	c, db, pool := newCluster(t, pgtest.WithSynchronousStandby())
	var w churn
	took := w.failover(t, c, pool, 4, 50)
	if n := w.lost(); n > 0 {
		t.Fatalf("%d acknowledged acquisitions lost across a synchronous failover", n)
	}
	if dups, _ := w.duplicates(); len(dups) > 0 {
		t.Fatalf("tokens acknowledged twice across a synchronous failover: %v", dups)
	}
	if n := w.refused.Load(); n > 0 {
		t.Fatalf("%d acquisitions refused as regressions across a synchronous failover", n)
	}
	var counter int64
	if err := pool.QueryRow(ctxT(t), "select token from pglocks_leases where name = 'ha'").Scan(&counter); err != nil {
		t.Fatal(err)
	}
	for _, a := range w.acked {
		if a.token > counter {
			t.Fatalf("acknowledged token %d is above the new primary's counter %d: lost", a.token, counter)
		}
	}
	t.Logf("%s: promotion %v; %d acquisitions acknowledged before it, %d after, %d failed in the outage; counter %d",
		db.Name, took.Round(time.Millisecond), w.count(false), w.count(true), w.failed.Load(), counter)
}

// TestFailoverAsyncChurn is TestFailoverSync on an asynchronous standby:
// acknowledged acquisitions may be lost and tokens handed out again. It
// measures how many, and checks the rule of detection: a store never
// accepts a token it has seen, so a token acknowledged twice is always
// acknowledged to two different stores.
func TestFailoverAsyncChurn(t *testing.T) {
	t.Parallel()
	c, _, pool := newCluster(t)
	var w churn
	took := w.failover(t, c, pool, 4, 50)
	dups, same := w.duplicates()
	if same > 0 {
		t.Fatalf("%d tokens acknowledged twice to the same store", same)
	}
	t.Logf("promotion %v; %d acquisitions acknowledged before it, %d after; lost: %d; tokens handed out again to other stores: %v; regressions refused: %d",
		took.Round(time.Millisecond), w.count(false), w.count(true), w.lost(), dups, w.refused.Load())
}

// TestFailoverAsyncLag fails over to an asynchronous standby that fell
// behind (its WAL receiver stopped) after a store acquired and released a
// lease five times: the five acknowledged acquisitions are lost. The store
// that saw them refuses the regressed token with a RegressionError and
// raises the counter, so its next acquisition is above everything it saw;
// a store that saw nothing accepts a token handed out before (documented).
func TestFailoverAsyncLag(t *testing.T) {
	t.Parallel()
	c, _, pool := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := newStore(t, pool, lease.Config{})
	acquire := func(s *lease.Store) (int64, error) {
		l, err := s.Acquire(ctx, "ha", time.Minute)
		if err != nil {
			return 0, err
		}
		return l.Token(), l.Release(ctx)
	}
	first, err := acquire(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.PauseReplication(ctx); err != nil {
		t.Fatal(err)
	}
	var last int64
	for range 5 {
		if last, err = acquire(s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	fresh := newStore(t, pool, lease.Config{}) // made now: it saw nothing
	_, err = acquire(s)
	var re *lease.RegressionError
	if !errors.As(err, &re) || re.Token != first+1 || re.Seen != last {
		t.Fatalf("acquire after losing tokens %d..%d: %v, want a RegressionError for token %d", first+1, last, err, first+1)
	}
	t.Logf("lost acquisitions: %d (tokens %d..%d); detected: %v", last-first, first+1, last, err)
	next, err := acquire(s)
	if err != nil || next != last+1 {
		t.Fatalf("acquire after the refusal: token %d, %v; want token %d", next, err, last+1)
	}
	// The counter now stands above everything s saw; a fresh store's
	// acquisitions follow it. Had s not raised it, fresh would have been
	// handed token first+1 again, silently.
	tok, err := acquire(fresh)
	if err != nil || tok != last+2 {
		t.Fatalf("fresh store: token %d, %v; want %d", tok, err, last+2)
	}
}

// TestStandbyRefused: a Store pointed at a standby by mistake fails at
// once, from TryAcquire and Acquire alike, with the server's 25006
// (read-only transaction).
func TestStandbyRefused(t *testing.T) {
	t.Parallel()
	c, db, _ := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, c.StandbyDSN(db.Name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := newStore(t, pool, lease.Config{})
	for _, op := range []string{"TryAcquire", "Acquire"} {
		start := time.Now()
		f := s.TryAcquire
		if op == "Acquire" {
			f = s.Acquire
		}
		_, err := f(ctx, "standby", time.Minute)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
			t.Fatalf("%s on a standby: %v, want SQLSTATE 25006", op, err)
		}
		t.Logf("%s: %v after %v", op, err, time.Since(start).Round(time.Millisecond))
	}
}
