package advisory_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/internal/patronienv"
	"github.com/pglocks/pglocks/pgtest"
)

// TestPatroniFailover moves the primary of a real Patroni cluster
// (synchronous mode, 2 nodes) while one Locker holds a lock and another
// waits for it, both on the multi-host DSN with
// target_session_attrs=read-write: by patronictl switchover, SIGKILL of
// the postmaster, SIGKILL of the primary's Patroni and postmaster
// together (a dead machine), and a partition of the primary from etcd,
// clients and its standby. Each time the held lock's Lost fires and the
// waiter acquires on the new primary. It logs, per fault, the time from
// the fault to the new primary accepting writes (Patroni's part) and from
// there to the waiter's acquisition (ours), p50 and max over the runs, and
// when the holder heard of its loss. PGLOCKS_PATRONI_FAULTS picks faults.
func TestPatroniFailover(t *testing.T) {
	runs := patronienv.Runs(t, 1)
	lockThroughPatroni(t, pgtest.PatroniOptions{}, runs, patronienv.Faults(
		pgtest.FaultSwitchover, pgtest.FaultKillPostmaster, pgtest.FaultKillNode, pgtest.FaultPartition))
}

// TestPatroniFailoverStrict is TestPatroniFailover under
// synchronous_mode_strict, on 3 nodes (with 2, a primary whose standby is
// gone accepts no write until it returns): SIGKILL of the postmaster and
// the partition unless PGLOCKS_PATRONI_FAULTS says otherwise.
func TestPatroniFailoverStrict(t *testing.T) {
	runs := patronienv.Runs(t, 1)
	lockThroughPatroni(t, pgtest.PatroniOptions{Strict: true, Nodes: 3}, runs, patronienv.Faults(
		pgtest.FaultKillPostmaster, pgtest.FaultPartition))
}

func lockThroughPatroni(t *testing.T, o pgtest.PatroniOptions, runs int, faults []pgtest.PatroniFault) {
	p := pgtest.NewPatroni(t, o)
	for _, f := range faults {
		if !p.Supports(f) {
			t.Logf("%s: not playable here (the nodes run on loopback): skipped", f)
			continue
		}
		var patroni, ours, lost []time.Duration
		failed := 0
		for i := range runs {
			var r lockRun
			// A subtest per run: its Lockers and pools close at its end,
			// not the whole test's (ten runs' sessions would fill the
			// new primary's max_connections).
			t.Run(fmt.Sprint(f, "-", i), func(t *testing.T) { r = lockFault(t, p, f, i) })
			switch {
			case r.writable == 0: // the run stopped early (its subtest failed)
				failed++
			case r.failed:
				patroni, lost, failed = append(patroni, r.writable), append(lost, r.lost), failed+1
			default:
				patroni, lost, ours = append(patroni, r.writable), append(lost, r.lost), append(ours, r.ours)
			}
		}
		t.Logf("%s, %d runs: new primary writable after p50 %v max %v; new holder after that p50 %v max %v (%d runs failed); holder told of its loss after p50 %v max %v",
			f, runs, p50(patroni), maxOf(patroni), p50(ours), maxOf(ours), failed, p50(lost), maxOf(lost))
	}
}

// lockRun is one fault's times from the fault: to a writable primary, to
// the holder's Lost; and from writable to the waiter's acquisition, unless
// the waiter failed.
type lockRun struct {
	writable, lost, ours time.Duration
	failed               bool
}

// waiterBound is how long after the new primary accepted writes a waiter
// may take to acquire before it counts as stuck: generous, the machine is
// shared.
const waiterBound = 2 * time.Minute

// lockFault runs one fault while a lock is held and waited for, checks
// that the holder is told and the waiter acquires, and lets the cluster
// recover.
func lockFault(t *testing.T, p *pgtest.Patroni, f pgtest.PatroniFault, i int) lockRun {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	holder := newLocker(t, pgtest.NewPool(t, patroniDSN(p)), advisory.Config{ApplicationName: "patroni-holder"})
	waiter := newLocker(t, pgtest.NewPool(t, patroniDSN(p)), advisory.Config{ApplicationName: "patroni-waiter"})
	key := pglocks.KeyOf(fmt.Sprint("patroni-", f, i))
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
	wctx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	go func() {
		w, err := waiter.Lock(wctx, key)
		got <- result{w, err, time.Now()}
	}()
	lostAt := make(chan time.Time, 1)
	go func() {
		select {
		case <-lk.Lost():
			lostAt <- time.Now()
		case <-ctx.Done():
		}
	}()
	fo, err := p.Fault(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	var lost time.Time
	select {
	case lost = <-lostAt:
	case <-ctx.Done():
		t.Fatalf("%s %d: the held lock's Lost never fired", f, i)
	}
	var r result
	select {
	case r = <-got:
	case <-time.After(time.Until(fo.At.Add(fo.Writable + waiterBound))): // a deadline, not a synchronization
		giveUp()
		r = <-got
		r.err = fmt.Errorf("no lock %v after the new primary accepted writes: %w", waiterBound, r.err)
	}
	run := lockRun{writable: fo.Writable, lost: lost.Sub(fo.At), ours: max(0, r.at.Sub(fo.At)-fo.Writable), failed: r.err != nil}
	t.Logf("%s %d: %s → %s writable after %v; holder told after %v (%v); waiter holds %v after writable (%v)",
		f, i, fo.Old, fo.New, ms(fo.Writable), ms(run.lost), lk.Err(), ms(run.ours), r.err)
	if r.err != nil {
		t.Errorf("%s %d: the waiter: %v", f, i, r.err)
	} else if err := r.lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fo.Recover(ctx); err != nil { // the old primary back as a synchronous standby
		t.Fatal(err)
	}
	return run
}

func p50(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return ms(s[len(s)/2])
}

func maxOf(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return ms(slices.Max(ds))
}

func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// patroniDSN is how a test reaches the cluster: the multi-host DSN
// (target_session_attrs=read-write), or HAProxy when
// PGLOCKS_PATRONI_VIA=haproxy — the two ways users connect.
func patroniDSN(p *pgtest.Patroni) string {
	if os.Getenv("PGLOCKS_PATRONI_VIA") == "haproxy" {
		return p.HAProxyDSN()
	}
	return p.DSN()
}
