package lease_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
)

// rowState returns the (owner is not null, token) of every row whose name
// starts with prefix, by name: what a test compares to see that nothing
// was written.
func rowState(t testing.TB, pool *pgxpool.Pool, prefix string) map[string]string {
	t.Helper()
	rows, err := pool.Query(ctxT(t), `select name, coalesce(owner::text, '-') || '/' || token || '/' || expires_at::text
		from pglocks_leases where starts_with(name, $1)`, pgx.QueryExecModeExec, prefix)
	if err != nil {
		t.Fatal(err)
	}
	m, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (kv [2]string, err error) {
		err = r.Scan(&kv[0], &kv[1])
		return kv, err
	})
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string, len(m))
	for _, kv := range m {
		out[kv[0]] = kv[1]
	}
	return out
}

func sameRows(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestSharedReadersAndWriter: many readers hold a name at once, in two
// stores; a writer is refused while they do, and its failed try writes
// nothing; once they are gone it gets in, and then readers and other
// writers are refused, writing nothing. It runs behind a
// transaction-mode PgBouncer too (TestViaTransactionBouncer).
func TestSharedReadersAndWriter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := newStore(t, b.pool, lease.Config{})
	ctx := ctxT(t)
	var readers []*lease.Lease
	for i := range 6 {
		s := b.store
		if i%2 == 1 {
			s = other
		}
		r, err := s.TryAcquireShared(ctx, "doc", time.Minute)
		if err != nil {
			t.Fatalf("reader %d: %v", i, err)
		}
		if !strings.HasPrefix(r.Name(), "doc#r.") {
			t.Fatalf("reader's row %q, want doc#r.…", r.Name())
		}
		readers = append(readers, r)
	}
	before := rowState(t, b.pool, "doc#")
	_, err := b.store.TryAcquireExclusive(ctx, "doc", time.Minute)
	var held *lease.HeldError
	if !errors.As(err, &held) || !strings.HasPrefix(held.Name, "doc#r.") {
		t.Fatalf("writer while readers hold: %v, want a HeldError naming a reader slot", err)
	}
	if after := rowState(t, b.pool, "doc#"); !sameRows(before, after) {
		t.Fatalf("a failed writer try wrote: %v, then %v", before, after)
	}
	for _, r := range readers {
		if err := r.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w, err := other.TryAcquireExclusive(ctx, "doc", time.Minute)
	if err != nil {
		t.Fatalf("writer once the readers left: %v", err)
	}
	before = rowState(t, b.pool, "doc#")
	if _, err := b.store.TryAcquireShared(ctx, "doc", time.Minute); !errors.As(err, &held) || held.Name != "doc#w" || held.Token != w.Token() {
		t.Fatalf("reader while a writer holds: %v, want a HeldError naming doc#w, token %d", err, w.Token())
	}
	if _, err := b.store.TryAcquireExclusive(ctx, "doc", time.Minute); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("second writer: %v, want ErrHeld", err)
	}
	if after := rowState(t, b.pool, "doc#"); !sameRows(before, after) {
		t.Fatalf("failed tries wrote: %v, then %v", before, after)
	}
	// A reader waiting for the writer gets in when it releases.
	got := make(chan error, 1)
	go func() {
		r, err := b.store.AcquireShared(ctx, "doc", time.Minute)
		if err == nil {
			err = r.Release(ctx)
		}
		got <- err
	}()
	waitParked(t, b.store)
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting reader did not get in after the writer's release")
	}
	// Slots are reused: six readers at most were in at once.
	if n := len(rowState(t, b.pool, "doc#r.")); n > 6 {
		t.Fatalf("%d reader slots, want at most 6", n)
	}
}

// TestSharedWriterWokenByRelease: a writer waiting for a reader is woken
// by the reader's release (NOTIFY), long before the reader's expiry.
func TestSharedWriterWokenByRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	r := mustShared(t, b.store, "rw", time.Minute)
	other := newStore(t, b.pool, lease.Config{})
	got := make(chan *lease.Lease, 1)
	go func() {
		w, err := other.AcquireExclusive(ctx, "rw", time.Minute)
		if err != nil {
			t.Error(err)
		}
		got <- w
	}()
	waitHeld(t, b.store, "rw#w") // the writer's row is taken: it waits for the reader
	if _, err := b.store.TryAcquireShared(ctx, "rw", time.Minute); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("new reader while a writer waits: %v, want ErrHeld", err)
	}
	start := time.Now()
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case w := <-got:
		if w == nil {
			return
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("writer got in %v after the release", d)
		}
		if err := w.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(40 * time.Second): // the reader's row would expire at 60 s
		t.Fatal("writer not woken by the reader's release")
	}
}

func mustShared(t testing.TB, s *lease.Store, rw string, ttl time.Duration, opts ...lease.Option) *lease.Lease {
	t.Helper()
	l, err := s.TryAcquireShared(ctxT(t), rw, ttl, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// waitHeld waits until name is held, by the server's word.
func waitHeld(t testing.TB, s *lease.Store, name string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		held, err := s.IsHeld(ctxT(t), name)
		if err != nil {
			t.Fatal(err)
		}
		if held {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not held within 30 s", name)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, with a deadline
	}
}

// TestSharedWriterNotStarved: under a continuous stream of readers whose
// holds overlap, so that some reader is always in, a writer gets in
// within about the longest hold among the readers in when it arrived; and
// once it waits, no new reader gets in.
func TestSharedWriterNotStarved(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	const hold = 300 * time.Millisecond
	var (
		wg       sync.WaitGroup
		admitted atomic.Int64
		writerIn atomic.Bool
		late     atomic.Int64 // readers admitted while the writer held the name (writerIn)
	)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				r, err := b.store.AcquireShared(ctx, "stream", time.Minute)
				if err != nil {
					if ctx.Err() == nil {
						t.Error(err)
					}
					return
				}
				if writerIn.Load() {
					late.Add(1)
				}
				admitted.Add(1)
				tm := time.NewTimer(hold + time.Duration(i)*hold/4) // holds overlap: some reader is always in
				select {
				case <-tm.C:
				case <-ctx.Done():
					tm.Stop()
				}
				_ = r.Release(context.WithoutCancel(ctx))
			}
		}()
	}
	for admitted.Load() < 8 { // the stream runs
		if ctx.Err() != nil {
			t.Fatal(ctx.Err())
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, under ctx's deadline
	}
	other := newStore(t, b.pool, lease.Config{})
	start := time.Now()
	w, err := other.AcquireExclusive(ctx, "stream", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	writerIn.Store(true)
	waited := time.Since(start)
	t.Logf("writer waited %v under a stream of readers holding up to %v", waited, 2*hold)
	if waited > 20*time.Second { // the longest hold in is 0.6 s: generous for a loaded machine
		t.Errorf("writer waited %v", waited)
	}
	// Cleared before the release: a reader parked meanwhile gets in
	// once the writer is out, and is not late.
	writerIn.Store(false)
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	wg.Wait()
	if n := late.Load(); n != 0 {
		t.Errorf("%d readers got in while the writer held the name", n)
	}
}

// TestSharedWriterFencing: the writer's lease fences like any lease: a
// stale writer's guarded write is refused, the current one's commits.
func TestSharedWriterFencing(t *testing.T) {
	t.Parallel()
	b := counterSetup(t)
	ctx := ctxT(t)
	old, err := b.store.TryAcquireExclusive(ctx, "acct", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := guardedIncrement(ctx, b.pool, old); err != nil {
		t.Fatal(err)
	}
	expire(t, b.pool, "acct#w")
	cur, err := b.store.AcquireExclusive(ctx, "acct", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if cur.Token() <= old.Token() {
		t.Fatalf("token %d after %d", cur.Token(), old.Token())
	}
	if err := guardedIncrement(ctx, b.pool, old); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("stale writer's guarded write: %v, want ErrNotHeld", err)
	}
	if err := guardedIncrement(ctx, b.pool, cur); err != nil {
		t.Fatal(err)
	}
}

// TestSharedBadInput: bad arguments give an error naming them and write
// nothing.
func TestSharedBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	var nilCtx context.Context
	for name, call := range map[string]func() error{
		"empty name": func() error { _, err := b.store.TryAcquireShared(ctx, "", time.Minute); return err },
		"too long": func() error {
			_, err := b.store.AcquireExclusive(ctx, strings.Repeat("n", lease.MaxNameLen), time.Minute)
			return err
		},
		"ttl":     func() error { _, err := b.store.AcquireShared(ctx, "x", 0); return err },
		"nil ctx": func() error { _, err := b.store.TryAcquireExclusive(nilCtx, "x", time.Minute); return err },
		"max hold": func() error {
			_, err := b.store.TryAcquireShared(ctx, "x", time.Minute, lease.WithMaxHold(0))
			return err
		},
	} {
		if err := call(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if n := len(rowState(t, b.pool, "")); n != 0 {
		t.Fatalf("%d rows written by refused calls", n)
	}
}
