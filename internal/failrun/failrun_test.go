package failrun_test

import (
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/pglocks/pglocks/internal/failrun"
)

// TestRun: the first failure of a run is Warn, the next ones Debug; the
// success that ends the run reports its length and duration once, and the
// next failure starts a new run at Warn.
func TestRun(t *testing.T) {
	t.Parallel()
	var r failrun.Run
	t0 := time.Now()
	if _, _, ended := r.Succeed(time.Now); ended {
		t.Error("a success with no run ended one")
	}
	if lv := r.Fail(t0); lv != slog.LevelWarn {
		t.Errorf("first failure at %v, want Warn", lv)
	}
	for i := range 5 {
		if lv := r.Fail(t0.Add(time.Duration(i) * time.Second)); lv != slog.LevelDebug {
			t.Errorf("failure %d at %v, want Debug", i+2, lv)
		}
	}
	n, d, ended := r.Succeed(func() time.Time { return t0.Add(10 * time.Second) })
	if !ended || n != 6 || d != 10*time.Second {
		t.Errorf("Succeed = %d, %v, %v; want 6, 10s, true", n, d, ended)
	}
	if _, _, ended := r.Succeed(time.Now); ended {
		t.Error("a second success ended the run again")
	}
	if lv := r.Fail(t0); lv != slog.LevelWarn {
		t.Errorf("first failure of a new run at %v, want Warn", lv)
	}
}

// TestRunConcurrent: of many concurrent failures exactly one is Warn, and
// of many concurrent successes exactly one ends the run.
func TestRunConcurrent(t *testing.T) {
	t.Parallel()
	var r failrun.Run
	var mu sync.Mutex
	var warns, ends int
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if r.Fail(time.Now()) == slog.LevelWarn {
				mu.Lock()
				warns++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for range 50 {
		wg.Go(func() {
			if _, _, ended := r.Succeed(time.Now); ended {
				mu.Lock()
				ends++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if warns != 1 || ends != 1 {
		t.Errorf("%d Warn failures and %d ends of the run, want 1 and 1", warns, ends)
	}
}
