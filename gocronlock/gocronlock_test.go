package gocronlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jonboulle/clockwork"
	"github.com/pglocks/pglocks/gocronlock"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/schedule"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pgtest.WrapMain(m, pgtest.WithTemplate(func(ctx context.Context, conn *pgx.Conn) error {
		leases, err := lease.SchemaSQL(lease.Config{})
		if err != nil {
			return err
		}
		runs, err := schedule.SchemaSQL(schedule.Config{})
		if err != nil {
			return err
		}
		_, err = conn.Exec(ctx, leases+runs)
		return err
	})))
}

// lockEvent is what one Lock call of one scheduler returned.
type lockEvent struct {
	replica, job string
	own          time.Time // the scheduler's (fake, skewed) clock at the call
	at           time.Time // the server's, when the slot was decided
	slot         string
	ran          bool
	closed       bool // the call stalled past its slot's window: no slot decided
}

// stalledSlot finds the slot in an ErrWindowClosed error's text.
var stalledSlot = regexp.MustCompile(`slot (\S+) not run`)

// recorder is the Locker each scheduler is given: gocronlock's, with a
// record of every call.
type recorder struct {
	replica string
	inner   *gocronlock.Locker
	clock   clockwork.Clock
	mu      *sync.Mutex
	events  *[]lockEvent
	t       *testing.T
}

func (r *recorder) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	e := lockEvent{replica: r.replica, job: key, own: r.clock.Now()}
	l, err := r.inner.Lock(ctx, key)
	var te *schedule.TakenError
	switch {
	case errors.As(err, &te):
		e.at, e.slot = te.At, te.Slot
	case errors.Is(err, schedule.ErrWindowClosed):
		r.t.Logf("%s %s: %v", r.replica, key, err) // a Start that stalled past its window: no slot to count
		e.closed = true
		if m := stalledSlot.FindStringSubmatch(err.Error()); m != nil {
			e.slot = m[1] // the slot it would have run
		}
	case err != nil:
		r.t.Errorf("%s %s: %v", r.replica, key, err)
	default:
		run := l.(*gocronlock.Lock).Run()
		e.at, e.slot, e.ran = run.At(), run.Record().Slot, true
	}
	r.mu.Lock()
	*r.events = append(*r.events, e)
	r.mu.Unlock()
	return l, err
}

// TestSchedulers runs five real gocron schedulers, each with its own fake
// clock up to ±2 s off (gocron.WithClock), each with two jobs every 250 ms
// and this package's Locker. The test fires each scheduler's timers at a
// phase of its own around the server's slot boundaries — two of them a
// little early — by advancing its clock. Every slot of each job must run
// exactly once, on one scheduler, none missed; gocron must have run the
// job exactly as often as a Lock succeeded.
func TestSchedulers(t *testing.T) {
	t.Parallel()
	const (
		period    = 250 * time.Millisecond
		tolerance = 80 * time.Millisecond
	)
	rounds := 40
	if n, err := strconv.Atoi(os.Getenv("GOCRONLOCK_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	jobs := []string{"report", "cleanup"}
	skews := []time.Duration{-2000 * time.Millisecond, -1370 * time.Millisecond, 530 * time.Millisecond,
		1970 * time.Millisecond, -690 * time.Millisecond}
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var (
		mu         sync.Mutex
		events     []lockEvent
		executions = map[string]*atomic.Int64{}
	)
	for _, name := range jobs {
		executions[name] = new(atomic.Int64)
	}
	rec := func(name string, clock clockwork.Clock, locker *gocronlock.Locker) gocron.Locker {
		return &recorder{replica: name, inner: locker, clock: clock, mu: &mu, events: &events, t: t}
	}
	var schedulers []gocron.Scheduler
	var clocks []*clockwork.FakeClock
	for i, skew := range skews {
		s, clock := newScheduler(t, db, fmt.Sprintf("replica-%d", i+1), skew, period, tolerance, jobs, executions, rec)
		schedulers, clocks = append(schedulers, s), append(clocks, clock)
	}
	// The ticks: round k at the server's k-th slot boundary from base, plus
	// the scheduler's phase (−skew mod 250 ms: 0, 120, −30, 30, −60 ms).
	now := serverNow(t, db)
	offset := time.Until(now) // server − local, about 0 on one host
	base := now.Truncate(period).Add(2 * period)
	var wg sync.WaitGroup
	for i, clock := range clocks {
		phase := (-skews[i]%period + period + period/2) % period
		phase -= period / 2
		wg.Go(func() {
			for k := range rounds {
				<-time.After(time.Until(base.Add(time.Duration(k)*period + phase - offset)))
				if err := clock.BlockUntilContext(ctx, len(jobs)); err != nil { // both jobs' timers are set
					t.Error(err)
					return
				}
				clock.Advance(period)
			}
		})
	}
	wg.Wait()
	awaitEvents(t, &mu, &events, len(skews)*len(jobs)*rounds)
	for _, s := range schedulers {
		if err := s.Shutdown(); err != nil {
			t.Error(err)
		}
	}
	check(t, events, executions, jobs, rounds, period, tolerance)
}

// newScheduler starts a gocron scheduler whose clock is a fake one, skew
// off, running jobs every period with a Locker of its own (wrapped by rec).
func newScheduler(t *testing.T, db *pgtest.DB, name string, skew, period, tolerance time.Duration, jobs []string,
	executions map[string]*atomic.Int64, rec func(string, clockwork.Clock, *gocronlock.Locker) gocron.Locker,
) (gocron.Scheduler, *clockwork.FakeClock) {
	t.Helper()
	clock := clockwork.NewFakeClockAt(time.Now().Add(skew))
	locker := newLocker(t, db, name, skew, schedule.Policy{Period: period, Tolerance: tolerance})
	s, err := gocron.NewScheduler(gocron.WithClock(clock), gocron.WithDistributedLocker(rec(name, clock, locker)))
	if err != nil {
		t.Fatal(err)
	}
	for _, job := range jobs {
		if _, err := s.NewJob(gocron.DurationJob(period), gocron.NewTask(func() { executions[job].Add(1) }), gocron.WithName(job)); err != nil {
			t.Fatal(err)
		}
	}
	s.Start()
	return s, clock
}

// check asserts once per slot for every job and logs the figures.
func check(t *testing.T, events []lockEvent, executions map[string]*atomic.Int64, jobs []string, rounds int, period, tolerance time.Duration) {
	var slots, dups, missed, early, clientDups, closed int
	schedulers := len(events) / len(jobs) / rounds
	for _, job := range jobs {
		runs := map[string]int{}
		stalledOn := map[string]bool{} // slots a call stalled past the window of
		var keys []string
		ran, stalled := 0, 0
		for _, e := range events {
			if e.job != job {
				continue
			}
			if e.closed {
				stalled++
				if e.slot != "" {
					stalledOn[e.slot] = true
				}
				continue
			}
			want := slotOf(e.at, period, tolerance)
			if e.slot != schedule.SlotKey(want) {
				t.Errorf("%s %s at %v: slot %s, want %v", e.replica, job, e.at, e.slot, want)
			}
			if e.at.Before(want) {
				early++
			}
			if _, ok := runs[e.slot]; !ok {
				keys = append(keys, e.slot)
			}
			runs[e.slot] += 0
			if e.ran {
				runs[e.slot]++
				ran++
			}
		}
		slices.Sort(keys) // schedule.SlotKey keys sort as text in time order
		// A round is left without a slot only if every scheduler's call of
		// it stalled past the window (a stalled machine, logged above).
		if lost := rounds - len(keys); len(keys) > rounds || lost > 0 && stalled < lost*schedulers {
			t.Errorf("%s: ticks landed on %d slots, want %d (one per round; %d calls stalled past their window)", job, len(keys), rounds, stalled)
		}
		closed += stalled
		for _, key := range keys {
			slots++
			if runs[key] == 0 && stalledOn[key] {
				t.Logf("%s slot %s: not run, its Start stalled past the window (logged above)", job, key)
				continue
			}
			if runs[key] != 1 {
				t.Errorf("%s slot %s: %d runs, want 1", job, key, runs[key])
				dups += max(0, runs[key]-1)
				if runs[key] == 0 {
					missed++
				}
			}
		}
		if got := executions[job].Load(); got != int64(ran) {
			t.Errorf("%s: gocron ran the job %d times, Lock succeeded %d times", job, got, ran)
		}
		clientDups += clientKeyDups(events, job, period)
	}
	t.Logf("%d gocron schedulers, %d slots (%d jobs × %d), %d Lock calls (%d before their slot's start, %d stalled past their window): duplicates %d, missed %d",
		schedulers, slots, len(jobs), rounds, len(events), early, closed, dups, missed)
	t.Logf("keyed by each scheduler's own clock truncated to the period (gocron's SQL locker): %d runs beyond one per slot", clientDups)
}

// clientKeyDups counts the runs beyond one per server slot that a locker
// keyed by the scheduler's clock truncated to the period would have let
// through (the first call with a key runs).
func clientKeyDups(events []lockEvent, job string, period time.Duration) int {
	ordered := slices.Clone(events)
	slices.SortFunc(ordered, func(a, b lockEvent) int { return a.at.Compare(b.at) })
	seen, runs := map[time.Time]bool{}, map[string]int{}
	for _, e := range ordered {
		if key := e.own.Truncate(period); e.job == job && !e.closed && !seen[key] {
			seen[key] = true
			runs[e.slot]++
		}
	}
	dups := 0
	for _, n := range runs {
		dups += max(0, n-1)
	}
	return dups
}

// awaitEvents waits until n Lock calls were recorded.
func awaitEvents(t *testing.T, mu *sync.Mutex, events *[]lockEvent, n int) {
	t.Helper()
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for deadline := time.Now().Add(time.Minute); ; <-poll.C {
		mu.Lock()
		got := len(*events)
		mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Lock calls in a minute, want %d", got, n)
		}
	}
}

// newLocker makes one replica's Locker: its own pool, lease store (with
// its clock skewed) and runner.
func newLocker(t *testing.T, db *pgtest.DB, name string, skew time.Duration, p schedule.Policy) *gocronlock.Locker {
	t.Helper()
	pool := db.NewPool(t)
	store, err := lease.New(pool, lease.Config{Hostname: name, Now: func() time.Time { return time.Now().Add(skew) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := store.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	runner, err := schedule.New(schedule.Config{Store: store, Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	locker, err := gocronlock.New(runner, p)
	if err != nil {
		t.Fatal(err)
	}
	return locker
}

func serverNow(t *testing.T, db *pgtest.DB) time.Time {
	t.Helper()
	var now time.Time
	if err := db.Conn(t).QueryRow(context.Background(), `select clock_timestamp()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// TestNew: a nil runner, or a policy without a period or with a bad one,
// is an error naming it; a nil Locker or Lock, an error.
func TestNew(t *testing.T) {
	t.Parallel()
	if _, err := gocronlock.New(nil, schedule.Policy{Period: time.Minute}); !errors.Is(err, schedule.ErrInvalid) {
		t.Errorf("nil runner: %v", err)
	}
	db := pgtest.New(t)
	pool := db.NewPool(t)
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close(context.Background())
	runner, err := schedule.New(schedule.Config{Store: store, Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	for want, p := range map[string]schedule.Policy{
		"Policy.Period (the slot's granularity) is zero":             {},
		"Policy.Tolerance (30s) must be below half of Policy.Period": {Period: time.Minute, Tolerance: 30 * time.Second},
		"Policy.Period is -1m0s":                                     {Period: -time.Minute},
	} {
		if _, err := gocronlock.New(runner, p); !errors.Is(err, schedule.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("New(%+v): %v, want %q", p, err, want)
		}
	}
	var l *gocronlock.Locker
	if _, err := l.Lock(context.Background(), "x"); err == nil {
		t.Error("Lock of a nil Locker: no error")
	}
	var k *gocronlock.Lock
	if err := k.Unlock(context.Background()); err == nil {
		t.Error("Unlock of a nil Lock: no error")
	}
}

// slotOf is the test's own oracle for the slot of server time at.
func slotOf(at time.Time, period, tolerance time.Duration) time.Time {
	p := period.Microseconds()
	return time.UnixMicro((at.UnixMicro() + tolerance.Microseconds()) / p * p)
}
