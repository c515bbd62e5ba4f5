package advisory_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// patroniRuns is how many faults of each kind TestPatroniFailover
// injects: PGLOCKS_PATRONI_RUNS, 1 if unset. The test is opt-in
// (PGLOCKS_PATRONI=1): a cluster starts in some 30 s and a killed primary
// is replaced after the leader key's TTL (20 s).
func patroniRuns(t *testing.T) int {
	t.Helper()
	if os.Getenv("PGLOCKS_PATRONI") != "1" {
		t.Skip("Patroni tests are opt-in: set PGLOCKS_PATRONI=1")
	}
	n, err := strconv.Atoi(os.Getenv("PGLOCKS_PATRONI_RUNS"))
	if err != nil || n <= 0 {
		return 1
	}
	return n
}

// TestPatroniFailover moves the primary of a real Patroni cluster
// (synchronous mode) while one Locker holds a lock and another waits for
// it, both on the multi-host DSN with target_session_attrs=read-write: by
// patronictl switchover, and by SIGKILL of the primary's Patroni and
// postmaster together (a dead machine). Each time the held lock's Lost
// fires and the waiter acquires on the new primary. It logs, per fault,
// the time from the fault to the new primary accepting writes with a
// synchronous standby (Patroni's part) and to the waiter's acquisition
// (ours on top), p50 and max over the runs.
func TestPatroniFailover(t *testing.T) {
	runs := patroniRuns(t)
	p := pgtest.NewPatroni(t, pgtest.PatroniOptions{})
	for _, fault := range []string{"switchover", "kill"} {
		var patroni, ours []time.Duration
		for i := range runs {
			pd, od := patroniFault(t, p, fault, i)
			patroni, ours = append(patroni, pd), append(ours, od)
		}
		t.Logf("%s, %d runs: new primary writable after p50 %v max %v; new holder after that p50 %v max %v",
			fault, runs, p50(patroni), slices.Max(patroni), p50(ours), slices.Max(ours))
	}
}

// patroniFault runs one fault and returns the time from it to the new
// primary being writable and to the waiter holding the lock.
func patroniFault(t *testing.T, p *pgtest.Patroni, fault string, i int) (time.Duration, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	holder := newLocker(t, pgtest.NewPool(t, p.DSN()), advisory.Config{ApplicationName: "patroni-holder"})
	waiter := newLocker(t, pgtest.NewPool(t, p.DSN()), advisory.Config{ApplicationName: "patroni-waiter"})
	key := pglocks.KeyOf(fmt.Sprint("patroni-", fault, i))
	lk, err := holder.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lk  *advisory.Lock
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	go func() {
		w, err := waiter.Lock(ctx, key)
		got <- result{w, err, time.Now()}
	}()
	old := p.Primary(ctx)
	start := time.Now()
	if fault == "switchover" {
		err = p.Switchover(ctx, "")
	} else {
		err = p.KillNode(old)
	}
	if err != nil {
		t.Fatal(err)
	}
	now, err := p.WaitPrimary(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	writable := time.Since(start)
	select {
	case <-lk.Lost():
	case <-ctx.Done():
		t.Fatalf("%s %d: the held lock's Lost never fired", fault, i)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("%s %d: the waiter: %v", fault, i, r.err)
	}
	held := r.at.Sub(start)
	t.Logf("%s %d: %s → %s, writable after %v, waiter holds after %v (lost: %v)", fault, i, old, now, writable, held, lk.Err())
	if err := r.lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if fault == "kill" {
		if err := p.StartNode(old); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.WaitSynchronous(ctx); err != nil { // the old primary back as a synchronous standby
		t.Fatal(err)
	}
	return writable, max(0, held-writable)
}

func p50(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
