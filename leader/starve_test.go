package leader_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
)

// burn spins until killed, when the test binary runs as a CPU burner.
func burn() {
	for n := 0; ; n++ {
		_ = n * n
	}
}

// TestStarvedLeadersDoNotFlap measures spurious demotions: 100 elections of
// one candidate each (every demotion is spurious: nobody else campaigns) in
// one process, for LEADER_STARVE (e.g. 2m), while 2 × NumCPU burner
// processes saturate the cores (LEADER_STARVE_BURNERS sets how many).
// LEADER_STARVE_GRACE sets Grace (default: the package default). A
// measurement, run by hand; skipped otherwise.
func TestStarvedLeadersDoNotFlap(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("LEADER_STARVE"))
	if err != nil {
		t.Skip("set LEADER_STARVE=2m to measure")
	}
	grace, _ := time.ParseDuration(os.Getenv("LEADER_STARVE_GRACE"))
	db := setup(t)
	pool := db.NewPool(t)
	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	const n = 100
	var (
		elected, demoted atomic.Int64
		mu               sync.Mutex
		reasons          = map[string]int{}
		allIn            = make(chan struct{})
		runs             = make(chan error, n)
		measuring        atomic.Bool
	)
	var effGrace time.Duration
	for i := range n {
		e, err := leader.New(leader.Config{Name: fmt.Sprintf("starve-%d", i), Pool: pool, Locker: locker, Store: store, Grace: grace})
		if err != nil {
			t.Fatal(err)
		}
		effGrace = e.Config().Grace
		go func() {
			runs <- e.Run(ctx, func(ctx context.Context, term leader.Term) error {
				if elected.Add(1) == n {
					close(allIn)
				}
				<-ctx.Done()
				if cause := context.Cause(ctx); measuring.Load() && !errors.Is(cause, leader.ErrStopped) {
					demoted.Add(1)
					r := cause.Error()
					if i := strings.Index(r, " ("); i > 0 {
						r = r[:i]
					}
					mu.Lock()
					reasons[r[:min(len(r), 90)]]++
					mu.Unlock()
				}
				return nil
			})
		}()
	}
	select {
	case <-allIn:
	case <-time.After(2 * time.Minute):
		t.Fatalf("only %d of %d elected", elected.Load(), n)
	}
	burners := 2 * runtime.NumCPU()
	if b, err := strconv.Atoi(os.Getenv("LEADER_STARVE_BURNERS")); err == nil && b > 0 {
		burners = b
	}
	for range burners {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "LEADER_BURN=1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	measuring.Store(true)
	<-time.After(d) // the measurement's duration
	measuring.Store(false)
	cancel()
	for range n {
		<-runs
	}
	mu.Lock()
	t.Logf("%d elections, Grace %v, %v under %d CPU burners: %d spurious demotions (%d elections in all); reasons: %v",
		n, effGrace, d, burners, demoted.Load(), elected.Load(), reasons)
	mu.Unlock()
	cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
	defer ccancel()
	_ = store.Close(cctx)
	_ = locker.Close(cctx)
}
