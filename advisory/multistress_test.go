package advisory_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
)

// stressOps is how many operations a stress test makes in all: small by
// default, 10,000 with PGLOCKS_STRESS=1.
func stressOps(small int) int {
	if os.Getenv("PGLOCKS_STRESS") == "1" {
		return 10000
	}
	return small
}

// stressCtx bounds a stress test: a minute, ten with PGLOCKS_STRESS=1.
func stressCtx(t testing.TB) context.Context {
	d := time.Minute
	if os.Getenv("PGLOCKS_STRESS") == "1" {
		d = 10 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// holdCheck counts, per key, the holders that the acquisitions themselves
// report, and fails the test when a key has two.
type holdCheck struct {
	t    testing.TB
	mu   sync.Mutex
	held map[pglocks.Key]int
}

func (c *holdCheck) add(keys []pglocks.Key, d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		c.held[k] += d
		if c.held[k] > 1 {
			c.t.Errorf("two holders of %s", k)
		}
	}
}

// 16 contenders on three lockers take random overlapping sets of 1 to 5
// of 8 keys, in random order, with TryLockAll and with LockAll: LockAll
// never deadlocks (a generous deadline that never passes), no key has two
// holders (by the holders' reports, and on the server: every key of a set
// is granted to the set's session), a failed try holds nothing, and
// nothing is held at the end.
func TestLockAllStress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	lockers := []*advisory.Locker{b.locker,
		newLocker(t, b.pool, advisory.Config{ApplicationName: b.app}),
		newLocker(t, b.pool, advisory.Config{ApplicationName: b.app})}
	ctx := stressCtx(t)
	universe := make([]pglocks.Key, 8)
	for i := range universe {
		universe[i] = pglocks.KeyOf("stress-" + string(rune('a'+i)))
	}
	ops := stressOps(200)
	check := &holdCheck{t: t, held: map[pglocks.Key]int{}}
	var next, took, busy, serverChecks atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for g := range 16 {
		l := lockers[g%len(lockers)]
		wg.Go(func() {
			for next.Add(1) <= int64(ops) && !t.Failed() {
				perm := rand.Perm(len(universe))[:1+rand.N(5)]
				keys := make([]pglocks.Key, len(perm))
				for i, p := range perm {
					keys[i] = universe[p]
				}
				var ls *advisory.Locks
				var err error
				if rand.N(2) == 0 {
					ls, err = l.TryLockAll(ctx, keys...)
				} else {
					wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					ls, err = l.LockAll(wctx, keys...)
					cancel()
				}
				if errors.Is(err, advisory.ErrLocked) {
					busy.Add(1)
					continue
				}
				if err != nil {
					t.Errorf("%d keys: %v", len(keys), err)
					return
				}
				took.Add(1)
				check.add(keys, 1)
				if rand.N(8) == 0 {
					serverChecks.Add(1)
					checkOnServer(t, ctx, b, ls)
				}
				check.add(keys, -1)
				if err := ls.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	t.Logf("%d ops in %v (%.0f/s): %d taken, %d busy tries, %d server checks", ops, elapsed.Round(time.Millisecond),
		float64(ops)/elapsed.Seconds(), took.Load(), busy.Load(), serverChecks.Load())
	waitFor(t, "nothing held", 30*time.Second, func() bool {
		held, waiting := countAdvisory(t, b.pool)
		return held == 0 && waiting == 0
	})
}

// checkOnServer checks in pg_locks that every key of ls is granted to
// ls's session, exclusively and to no other.
func checkOnServer(t testing.TB, ctx context.Context, b *bundle, ls *advisory.Locks) {
	t.Helper()
	for _, k := range ls.Keys() {
		hs, err := advisory.Holders(ctx, b.pool, k)
		if err != nil {
			t.Error(err)
			return
		}
		if len(hs) != 1 || !hs[0].Granted || hs[0].PID != ls.PID() || !hs[0].Exclusive() {
			t.Errorf("key %s: holders %+v, want only pid %d", k, hs, ls.PID())
		}
	}
}

// permitCheck counts the permits the acquisitions report as held and
// trusted: a permit on a session the test is about to terminate is not
// trusted from the moment the test picks it (its slot may be taken by
// another before its holder hears of the loss).
type permitCheck struct {
	t      testing.TB
	limit  int
	mu     sync.Mutex
	slots  map[int]int
	doomed map[uint32]bool
	live   map[*advisory.Permits]bool // trusted
	max    int
}

func (c *permitCheck) took(p *advisory.Permits) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.doomed[p.PID()] {
		return
	}
	c.live[p] = true
	n := 0
	for q := range c.live {
		n += q.N()
	}
	c.max = max(c.max, n)
	if n > c.limit {
		c.t.Errorf("%d trusted permits, limit %d", n, c.limit)
	}
	for _, s := range p.Slots() {
		if c.slots[s]++; c.slots[s] > 1 {
			c.t.Errorf("slot %d has two trusted holders", s)
		}
	}
}

func (c *permitCheck) gone(p *advisory.Permits) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live[p] {
		delete(c.live, p)
		for _, s := range p.Slots() {
			c.slots[s]--
		}
	}
}

// doom picks a trusted permit's session, untrusts every permit on it and
// returns its pid, 0 if none is held.
func (c *permitCheck) doom() uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p := range c.live {
		pid := p.PID()
		c.doomed[pid] = true
		for q := range c.live {
			if q.PID() == pid {
				delete(c.live, q)
				for _, s := range q.Slots() {
					c.slots[s]--
				}
			}
		}
		return pid
	}
	return 0
}

// A semaphore of 3 under 32 goroutines on three lockers, with random
// deadlines and n of 1 or 2, while the test terminates permit holders'
// sessions: never more than 3 trusted permits, by the holders' reports
// and on the server, and nothing held at the end.
func TestSemaphoreStress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	lockers := []*advisory.Locker{b.locker,
		newLocker(t, b.pool, advisory.Config{ApplicationName: b.app}),
		newLocker(t, b.pool, advisory.Config{ApplicationName: b.app})}
	ctx := stressCtx(t)
	const limit = 3
	check := &permitCheck{t: t, limit: limit, slots: map[int]int{}, doomed: map[uint32]bool{}, live: map[*advisory.Permits]bool{}}
	ops := stressOps(300)
	// Open the lockers' sessions first: the deadlines are for waiting,
	// not for connecting.
	for _, l := range lockers {
		sem, _ := l.Semaphore("stress", limit)
		p, err := sem.Acquire(ctx, limit)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var next, took, timedOut, lost, kills atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for g := range 32 {
		sem, err := lockers[g%len(lockers)].Semaphore("stress", limit)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for i := next.Add(1); i <= int64(ops) && !t.Failed(); i = next.Add(1) {
				if i%50 == 0 {
					if pid := check.doom(); pid != 0 {
						kills.Add(1)
						if err := b.db.Server.TerminateBackend(ctx, pid); err != nil {
							t.Error(err)
						}
					}
				}
				n := 1 + rand.N(4)/3 // one in four asks for 2
				wctx, cancel := context.WithTimeout(ctx, time.Duration(rand.N(100*int64(time.Millisecond))))
				p, err := sem.Acquire(wctx, n)
				cancel()
				switch {
				case errors.Is(err, context.DeadlineExceeded):
					timedOut.Add(1)
					continue
				case err != nil:
					// A session terminated while the call ran on it: the
					// call retried elsewhere or failed; nothing is held.
					if !errors.Is(err, advisory.ErrLost) {
						t.Logf("acquire: %v", err)
					}
					continue
				}
				took.Add(1)
				check.took(p)
				if i%10 == 0 {
					if c, err := sem.Count(ctx); err != nil || c > limit {
						t.Errorf("Count = %d, %v; limit %d", c, err, limit)
					}
				}
				check.gone(p)
				if err := p.Release(ctx); err != nil {
					if !errors.Is(err, advisory.ErrNotHeld) || !errors.Is(err, advisory.ErrLost) {
						t.Error(err)
					}
					lost.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	t.Logf("%d ops in %v (%.0f/s): %d acquired, %d timed out, %d sessions terminated, %d permits lost, at most %d trusted permits at once",
		ops, elapsed.Round(time.Millisecond), float64(ops)/elapsed.Seconds(), took.Load(), timedOut.Load(), kills.Load(), lost.Load(), check.max)
	waitFor(t, "nothing held", 30*time.Second, func() bool {
		held, waiting := countAdvisory(t, b.pool)
		return held == 0 && waiting == 0
	})
}
