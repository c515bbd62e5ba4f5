// Command cron shows a scheduled job that runs once per slot across
// replicas whose clocks disagree. Every replica runs the same schedule — a
// tick every 400 ms by its own clock, as a crontab line or a ticker would —
// and at each tick asks package schedule to run the job "nightly-report".
// The slot is decided by the database server's clock, with a tolerance for
// ticks that come a little early: the replica that asks first runs the
// slot, and the others learn who did, without running it. Nothing makes
// the replicas wait for each other.
//
//	go run ./examples/cron
//
// The replicas' clocks are set seconds apart, several slots: a lock keyed
// by the replica's own clock would run the job more than once per slot
// here, and a lock released when the short job ends would let a late
// replica run it again. At the end the job's history is printed: slot,
// replica, token, outcome.
//
// The replicas are goroutines with a pool, a [lease.Store] and a
// [schedule.Runner] each, as separate processes would have. It runs on a
// throwaway PostgreSQL; with -dsn URL it runs in a schema of its own in
// that database (its lease and run tables), dropped at the end.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglocks/pglocks/examples/internal/exampledb"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/schedule"
)

const (
	job       = "nightly-report"
	period    = 400 * time.Millisecond
	tolerance = 120 * time.Millisecond
	ticks     = 24
	jobTime   = 30 * time.Millisecond // far shorter than the clocks' skew
)

// skews are the replicas' clock errors: their ticks reach the server 100 ms
// late, 60 ms early and 50 ms late in each slot.
var skews = []time.Duration{-1300 * time.Millisecond, 1260 * time.Millisecond, 1950 * time.Millisecond}

func main() { exampledb.Main(run) }

// replica is one instance of the service.
type replica struct {
	name string
	skew time.Duration
	pool *pgxpool.Pool
	job  *schedule.Job
}

// now is the replica's own clock.
func (r *replica) now() time.Time { return time.Now().Add(r.skew) }

// attempt is what one replica did at one tick.
type attempt struct {
	Replica string
	Slot    string // by the server's clock
	Ran     bool
	Token   int64 // of the run that has the slot
}

// run starts the replicas, lets them tick for the length of the schedule
// and prints the job's history.
func run(ctx context.Context, db exampledb.Target, out io.Writer) (attempts []attempt, err error) {
	var rs []*replica
	var stores []*lease.Store
	defer func() {
		for i, s := range stores {
			err = errors.Join(err, s.Close(context.WithoutCancel(ctx)))
			rs[i].pool.Close()
		}
	}()
	var runner *schedule.Runner
	for i, skew := range skews {
		r := &replica{name: fmt.Sprintf("replica-%d", i+1), skew: skew}
		if r.pool, err = pgxpool.New(ctx, db.DSN); err != nil {
			return nil, err
		}
		store, err := lease.New(r.pool, lease.Config{Schema: db.Schema, Hostname: r.name, Now: r.now})
		if err != nil {
			r.pool.Close()
			return nil, err
		}
		rs, stores = append(rs, r), append(stores, store)
		if runner, err = schedule.New(schedule.Config{Store: store, Pool: r.pool, Schema: db.Schema}); err != nil {
			return nil, err
		}
		if r.job, err = runner.Job(job, schedule.Policy{Period: period, Tolerance: tolerance}); err != nil {
			return nil, err
		}
	}
	if err := runner.Migrate(ctx); err != nil {
		return nil, err
	}

	fmt.Fprintf(out, "%d replicas tick every %v by their own clocks (off by %v), job %q: one run per %v slot of the server's clock\n",
		len(rs), period, skews, job, period)
	out = &lockedWriter{w: out}
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	stop := time.After(ticks * period)
	done := make(chan struct{})
	for _, r := range rs {
		wg.Go(func() {
			for a := range r.ticks(ctx, out, done) {
				mu.Lock()
				attempts = append(attempts, a)
				mu.Unlock()
			}
		})
	}
	<-stop
	close(done)
	wg.Wait()
	summary(out, attempts)
	return attempts, history(ctx, out, runner)
}

// summary prints how many slots the ticks reached and how often each ran.
func summary(out io.Writer, attempts []attempt) {
	runs := map[string]int{}
	byReplica := map[string]int{}
	for _, a := range attempts {
		runs[a.Slot] += 0
		if a.Ran {
			runs[a.Slot]++
			byReplica[a.Replica]++
		}
	}
	once := 0
	for _, n := range runs {
		if n == 1 {
			once++
		}
	}
	fmt.Fprintf(out, "%d ticks reached %d slots, %d of them run exactly once; runs by replica: %v\n",
		len(attempts), len(runs), once, byReplica)
}

// ticks runs the replica's schedule until done is closed: at each multiple
// of the period on its own clock, it asks for the slot of that moment.
func (r *replica) ticks(ctx context.Context, out io.Writer, done <-chan struct{}) <-chan attempt {
	ch := make(chan attempt)
	go func() {
		defer close(ch)
		for {
			own := r.now()
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-time.After(own.Truncate(period).Add(period).Sub(own)):
			}
			if a, ok := r.tick(ctx, out); ok {
				ch <- a
			}
		}
	}()
	return ch
}

// tick runs the job if the server's current slot has not been run.
func (r *replica) tick(ctx context.Context, out io.Writer) (attempt, bool) {
	own := r.now().Format("15:04:05.000")
	rec, err := r.job.Do(ctx, report)
	var taken *schedule.TakenError
	switch {
	case errors.As(err, &taken):
		fmt.Fprintf(out, "  %s (own clock %s): slot %s taken by %s (token %d, %s)\n",
			r.name, own, clock(taken.Slot), taken.By.Hostname, taken.By.Token, taken.By.Outcome)
		return attempt{Replica: r.name, Slot: taken.Slot, Token: taken.By.Token}, true
	case err != nil:
		fmt.Fprintf(out, "  %s: %v\n", r.name, err)
		return attempt{}, false
	}
	fmt.Fprintf(out, "  %s (own clock %s): slot %s RAN the job (token %d, %v)\n",
		r.name, own, clock(rec.Slot), rec.Token, rec.End.Sub(rec.Start).Round(time.Millisecond))
	return attempt{Replica: r.name, Slot: rec.Slot, Ran: true, Token: rec.Token}, true
}

// report is the job: a short piece of work, abandoned if ctx ends (the
// run's lease lost). A job that writes to the database would guard its
// transaction with run.Lease().Guard.
func report(ctx context.Context, run *schedule.Run) error {
	select {
	case <-time.After(jobTime):
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// history prints the job's last runs, as the run table keeps them.
func history(ctx context.Context, out io.Writer, runner *schedule.Runner) error {
	recs, err := runner.History(ctx, job, 10)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "the job's last %d runs (server clock; a run started before its slot was a tick up to %v early):\n", len(recs), tolerance)
	for _, rec := range recs {
		fmt.Fprintf(out, "  slot %s  %-10s token %-3d %-9s started %s, took %v\n", clock(rec.Slot), rec.Hostname,
			rec.Token, rec.Outcome, rec.Start.UTC().Format("15:04:05.000"), rec.End.Sub(rec.Start).Round(time.Millisecond))
	}
	return nil
}

// clock shows a slot's key, an RFC 3339 time, as a time of day (UTC).
func clock(slot string) string {
	t, err := time.Parse(time.RFC3339Nano, slot)
	if err != nil {
		return slot
	}
	return t.Format("15:04:05.000")
}

// lockedWriter serializes the replicas' writes to one writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (lw *lockedWriter) Write(p []byte) (int, error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.w.Write(p)
}
