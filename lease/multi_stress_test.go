package lease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
)

// stressRounds is n, or big when PGLOCKS_STRESS=1.
func stressRounds(n, big int) int {
	if os.Getenv("PGLOCKS_STRESS") == "1" {
		return big
	}
	return n
}

// TestAcquireAllNoDeadlock: 16 goroutines over two stores take random
// overlapping sets of 1–5 of 8 names, in random order, with AcquireAll;
// every call ends within its bound (no deadlock: the statement never
// waits for a row lock), and no name is ever held by two holders at once
// (an in-process owner per name, set while a set is held).
func TestAcquireAllNoDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	stores := []*lease.Store{b.store, newStore(t, b.pool, lease.Config{})}
	const workers, names = 16, 8
	total := stressRounds(160, 10000)
	var owner [names]atomic.Int32
	var next, done atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[w%2]
			for next.Add(1) <= int64(total) && ctx.Err() == nil {
				idx := rand.Perm(names)[:1+rand.IntN(5)]
				set := make([]string, len(idx))
				for i, k := range idx {
					set[i] = fmt.Sprintf("dl%d", k)
				}
				cctx, ccancel := context.WithTimeout(ctx, time.Minute)
				ls, err := s.AcquireAll(cctx, set, time.Minute)
				ccancel()
				if err != nil {
					t.Errorf("AcquireAll %v: %v", set, err)
					return
				}
				for _, k := range idx {
					if !owner[k].CompareAndSwap(0, int32(w+1)) {
						t.Errorf("dl%d held by worker %d and %d at once", k, owner[k].Load()-1, w)
					}
				}
				for _, k := range idx {
					owner[k].Store(0)
				}
				for _, l := range ls {
					if err := l.Release(ctx); err != nil {
						t.Error(err)
					}
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	t.Logf("%d AcquireAll rounds (16 goroutines, 1–5 of 8 names) in %v: %.0f sets/s", done.Load(), d.Round(time.Millisecond), float64(done.Load())/d.Seconds())
	if held, err := b.store.List(ctx); err != nil || len(held) != 0 {
		t.Errorf("held at the end: %v, %v", held, err)
	}
}

// TestSemaphoreStress: 32 goroutines take 1–2 permits of a semaphore of
// limit 3 with random deadlines, while the holders' sessions are killed
// now and then. From the acquisitions' own reports the permits trusted at
// once never exceed 3, each slot's tokens are distinct (and each grant's
// token is above every earlier grant of the slot that returned before it
// was asked), and nothing is held at the end.
func TestSemaphoreStress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pool := b.db.NewPool(t, func(c *pgxpool.Config) {
		c.MaxConns = 40
		c.ConnConfig.RuntimeParams["application_name"] = "semstress"
	})
	s := newStore(t, pool, lease.Config{})
	sem, err := s.Semaphore("st", 3)
	if err != nil {
		t.Fatal(err)
	}
	total := stressRounds(200, 10000)
	var (
		trusted, peak atomic.Int64
		next, got     atomic.Int64
		mu            sync.Mutex
		tokens        = map[string]map[int64]bool{}
		highest       = map[string]int64{} // per slot, among grants already returned
	)
	stopKill := make(chan struct{})
	killed := make(chan int)
	go func() { // the killer
		n := 0
		defer func() { killed <- n }()
		for {
			select {
			case <-stopKill:
				return
			case <-time.After(time.Duration(200+rand.IntN(300)) * time.Millisecond):
			}
			k, _ := b.db.TerminateApplication(ctx, "semstress")
			n += k
		}
	}()
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(total) && ctx.Err() == nil {
				mu.Lock()
				before := make(map[string]int64, len(highest))
				for k, v := range highest {
					before[k] = v
				}
				mu.Unlock()
				actx, acancel := context.WithTimeout(ctx, time.Duration(50+rand.IntN(2000))*time.Millisecond)
				p, err := sem.Acquire(actx, 1+rand.IntN(2), 10*time.Second)
				acancel()
				if err != nil {
					continue // a deadline, a killed session: nothing is held
				}
				got.Add(1)
				n := int64(p.N())
				if v := trusted.Add(n); v > 3 {
					t.Errorf("%d permits trusted at once", v)
				} else {
					for {
						if old := peak.Load(); v <= old || peak.CompareAndSwap(old, v) {
							break
						}
					}
				}
				mu.Lock()
				for _, l := range p.Leases() {
					if tokens[l.Name()] == nil {
						tokens[l.Name()] = map[int64]bool{}
					}
					if tokens[l.Name()][l.Token()] {
						t.Errorf("%s: token %d granted twice", l.Name(), l.Token())
					}
					tokens[l.Name()][l.Token()] = true
					if l.Token() <= before[l.Name()] {
						t.Errorf("%s: token %d after %d", l.Name(), l.Token(), before[l.Name()])
					}
					highest[l.Name()] = max(highest[l.Name()], l.Token())
				}
				mu.Unlock()
				if rand.IntN(4) == 0 {
					time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond) // hold the permits a while (work, not synchronization)
				}
				trusted.Add(-n)
				_ = p.Release(ctx) // killed sessions: released in the background
			}
		}()
	}
	wg.Wait()
	close(stopKill)
	kills := <-killed
	t.Logf("%d acquisitions of %d tries, peak %d permits trusted at once, %d sessions killed", got.Load(), total, peak.Load(), kills)
	if got.Load() == 0 {
		t.Fatal("no acquisition succeeded")
	}
	cctx, ccancel := context.WithTimeout(ctx, time.Minute)
	defer ccancel()
	if err := s.Close(cctx); err != nil { // waits for background releases
		t.Fatal(err)
	}
	if n, err := sem.Count(ctx); !errors.Is(err, lease.ErrClosed) {
		t.Fatalf("Count on a closed store: %d, %v", n, err)
	}
	other, _ := b.store.Semaphore("st", 3)
	if n, err := other.Count(ctx); err != nil || n != 0 {
		t.Errorf("%d permits held at the end (%v)", n, err)
	}
	if held, err := b.store.IsHeld(ctx, "st#turn"); err != nil || held {
		t.Errorf("turn held at the end: %v, %v", held, err)
	}
}
