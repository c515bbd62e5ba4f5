package advisory_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
)

// A semaphore of 3 grants 3 permits across lockers and no more; n permits
// come all or none; Holders reads them from pg_locks, slot by slot.
func TestSemaphoreLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := newLocker(t, b.pool, advisory.Config{ApplicationName: b.app})
	ctx := ctxT(t)
	s1, err := b.locker.Semaphore("jobs", 3)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := other.Semaphore("jobs", 3)
	if err != nil {
		t.Fatal(err)
	}
	two, err := s1.TryAcquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if two.N() != 2 || len(two.Slots()) != 2 {
		t.Fatalf("N = %d, Slots = %v, want 2 permits", two.N(), two.Slots())
	}
	// One left: two more are refused and nothing is taken for them.
	if _, err := s2.TryAcquire(ctx, 2); !errors.Is(err, advisory.ErrLocked) {
		t.Fatalf("TryAcquire(2) with one permit left: %v, want ErrLocked", err)
	}
	one, err := s2.TryAcquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s1.TryAcquire(ctx, 1); !errors.Is(err, advisory.ErrLocked) {
		t.Fatalf("fourth permit: %v, want ErrLocked", err)
	}
	if n, err := s1.Count(ctx); err != nil || n != 3 {
		t.Fatalf("Count = %d, %v, want 3", n, err)
	}
	ps, err := advisory.SemaphorePermits(ctx, b.pool, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]uint32{}
	for _, p := range ps {
		seen[p.Slot] = p.PID
	}
	if len(seen) != 3 || seen[one.Slots()[0]] != one.PID() || seen[two.Slots()[0]] != two.PID() {
		t.Fatalf("permits %+v, want slots %v (pid %d) and %v (pid %d)", ps, two.Slots(), two.PID(), one.Slots(), one.PID())
	}
	// The slot key is what psql computes.
	var v int64
	if err := b.pool.QueryRow(ctx, "select hashtextextended('pglocks.sem:jobs:' || 2, 0)").Scan(&v); err != nil || v != advisory.SlotKey("jobs", 2).Int64() {
		t.Fatalf("slot key %d, %v; want %d", v, err, advisory.SlotKey("jobs", 2).Int64())
	}
	if err := two.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := one.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := one.Release(ctx); !errors.Is(err, advisory.ErrNotHeld) {
		t.Fatalf("second Release: %v, want ErrNotHeld", err)
	}
	if n, err := s2.Count(ctx); err != nil || n != 0 {
		t.Fatalf("Count after release = %d, %v", n, err)
	}
}

// A permit dies with its session: the slot is free at once for another
// process, and the holder hears of the loss.
func TestSemaphorePermitLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := newLocker(t, b.pool, advisory.Config{ApplicationName: b.app})
	ctx := ctxT(t)
	s1, _ := b.locker.Semaphore("crash", 1)
	s2, _ := other.Semaphore("crash", 1)
	p, err := s1.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *advisory.Permits, 1)
	go func() {
		q, err := s2.Acquire(ctx, 1)
		if err != nil {
			t.Error(err)
		}
		got <- q
	}()
	if err := b.db.Server.TerminateBackend(ctx, p.PID()); err != nil {
		t.Fatal(err)
	}
	<-p.Lost()
	// The Context ends right after Lost closes (the same callback cancels
	// it next), not before: wait for it (CI read a nil cause once).
	<-p.Context().Done()
	if !errors.Is(p.Err(), advisory.ErrLost) || !errors.Is(context.Cause(p.Context()), advisory.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", p.Err())
	}
	q := <-got
	if q == nil {
		return
	}
	if err := q.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// SetLimit changes the handle's limit; a lowered limit grants no slot at
// or above it and revokes nothing.
func TestSemaphoreSetLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	sem, _ := b.locker.Semaphore("resize", 1)
	a, err := sem.TryAcquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := sem.SetLimit(3); err != nil || sem.Limit() != 3 {
		t.Fatal(err, sem.Limit())
	}
	c, err := sem.TryAcquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := sem.SetLimit(1); err != nil {
		t.Fatal(err)
	}
	if a.Err() != nil || c.Err() != nil {
		t.Fatal("a lowered limit revoked a permit")
	}
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Slots 1 and 2 are free now, but the limit is 1 and slot 0 is held
	// by a unless a took another slot: only what is below the limit counts.
	_, err = sem.TryAcquire(ctx, 1)
	if a.Slots()[0] == 0 && !errors.Is(err, advisory.ErrLocked) {
		t.Fatalf("TryAcquire under a lowered limit: %v, want ErrLocked", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Bad input is refused with an error naming the problem.
func TestSemaphoreBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	for _, c := range []struct {
		name  string
		limit int
		want  string
	}{{"", 1, "empty"}, {"x", 0, "limit 0"}, {"x", -1, "limit -1"}, {"x", advisory.MaxLimit + 1, "MaxLimit"}} {
		if _, err := b.locker.Semaphore(c.name, c.limit); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Semaphore(%q, %d): %v, want an error saying %q", c.name, c.limit, err, c.want)
		}
	}
	sem, err := b.locker.Semaphore("bad", 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, -1, 3} {
		for _, wait := range []bool{false, true} {
			var err error
			if wait {
				_, err = sem.Acquire(ctx, n)
			} else {
				_, err = sem.TryAcquire(ctx, n)
			}
			if err == nil || !strings.Contains(err.Error(), "want 1 to the limit (2)") {
				t.Errorf("n = %d, wait %v: %v", n, wait, err)
			}
		}
	}
	var nilCtx context.Context
	if _, err := sem.TryAcquire(nilCtx, 1); err == nil || !strings.Contains(err.Error(), "nil context") {
		t.Errorf("nil ctx: %v", err)
	}
	if err := sem.SetLimit(0); err == nil {
		t.Error("SetLimit(0) accepted")
	}
	if n, err := sem.Count(ctx); err != nil || n != 0 {
		t.Fatalf("Count after bad input = %d, %v", n, err)
	}
}

// A waiter for 2 permits gets them although single takers keep taking
// and returning the permits of a semaphore of 2: it holds the turnstile,
// which stops new single takers while it gathers.
func TestSemaphoreNoStarvation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := newLocker(t, b.pool, advisory.Config{ApplicationName: b.app})
	ctx := ctxT(t)
	stop := make(chan struct{})
	var takes [4]int
	var total atomic.Int64
	done := make(chan struct{})
	for i := range takes {
		l := b.locker
		if i%2 == 1 {
			l = other
		}
		sem, _ := l.Semaphore("fair", 2)
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				select {
				case <-stop:
					return
				default:
				}
				p, err := sem.Acquire(ctx, 1)
				if err != nil {
					t.Error(err)
					return
				}
				takes[i]++
				total.Add(1)
				if err := p.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	sem, _ := other.Semaphore("fair", 2)
	// Let the stream run first: both permits are taken and returned
	// over and over.
	waitFor(t, "single takers under way", 30*time.Second, func() bool { return total.Load() >= 100 })
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p, err := sem.Acquire(wctx, 2)
	took := time.Since(start)
	if err == nil {
		if err := p.Release(ctx); err != nil {
			t.Error(err)
		}
	}
	close(stop)
	for range takes {
		<-done
	}
	if err != nil {
		t.Fatalf("Acquire(2) under a stream of single takers: %v after %v (%v takes)", err, took, takes)
	}
	t.Logf("Acquire(2) took %v under single takers (%v takes)", took.Round(time.Millisecond), takes)
}

// The Observer sees a semaphore's permits under the semaphore's name
// (KeyOf("pglocks.sem:" + name)), so that a metrics adapter counts the
// permits held per semaphore, and one acquire call per Acquire.
func TestSemaphoreObserved(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	held := map[string]int{}
	acquires := map[string]int{}
	obs := &pglocks.Observer{
		Acquire: func(e pglocks.AcquireEvent) { mu.Lock(); acquires[e.Name]++; mu.Unlock() },
		Start:   func(e pglocks.HoldEvent) { mu.Lock(); held[e.Name]++; mu.Unlock() },
		End:     func(e pglocks.EndEvent) { mu.Lock(); held[e.Name]--; mu.Unlock() },
	}
	b := setup(t, advisory.Config{Observer: obs})
	ctx := ctxT(t)
	sem, _ := b.locker.Semaphore("observed", 3)
	p, err := sem.Acquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	name := pglocks.KeyOf("pglocks.sem:observed").String()
	count := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return held[name], acquires[name]
	}
	waitFor(t, "2 permits observed", 30*time.Second, func() bool { h, a := count(); return h == 2 && a == 1 })
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the permits' ends observed", 30*time.Second, func() bool { h, _ := count(); return h == 0 })
}

// TestBusyMessages: a busy semaphore try names the semaphore and its
// permits, not its slot key; a busy TryLockAll names its keys, not a
// "first" one that may not be the busy one.
func TestBusyMessages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := newLocker(t, b.pool, advisory.Config{ApplicationName: b.app})
	ctx := ctxT(t)
	sem, err := b.locker.Semaphore("exports", 3)
	if err != nil {
		t.Fatal(err)
	}
	p, err := sem.TryAcquire(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Release(ctx) }()
	sem2, err := other.Semaphore("exports", 3)
	if err != nil {
		t.Fatal(err)
	}
	for n, want := range map[int]string{1: `advisory: semaphore "exports": no permit of 3 free`,
		2: `advisory: semaphore "exports": fewer than 2 of 3 permits free`} {
		if _, err := sem2.TryAcquire(ctx, n); !errors.Is(err, advisory.ErrLocked) || err.Error() != want {
			t.Errorf("TryAcquire(%d) = %v, want ErrLocked saying %q", n, err, want)
		}
	}
	a, bk := pglocks.KeyOf("account:A"), pglocks.KeyOf("account:B")
	lk, err := other.TryLock(ctx, bk)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lk.Unlock(ctx) }()
	_, err = b.locker.TryLockAll(ctx, bk, a)
	want := "advisory: trylockall of 2 keys (" + bk.String() + ", " + a.String() + "): locked by another holder"
	if !errors.Is(err, advisory.ErrLocked) || err.Error() != want {
		t.Errorf("TryLockAll = %v, want ErrLocked saying %q", err, want)
	}
}
