// Command cron shows a scheduled job that runs on one replica only: every
// replica runs the same schedule, and at each tick each tries the lease
// "cron:nightly-report". The one that gets it runs the job, renewing the lease
// in the background while the job outlasts its TTL; the others skip the tick.
// If the runner dies, its lease expires after one short TTL and the next tick
// runs elsewhere.
//
//	go run ./examples/cron
//
// The replicas are goroutines with a pool and a [lease.Store] each, as
// separate processes would have. With DATABASE_URL unset it runs on a
// throwaway PostgreSQL.
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
)

const (
	job      = "cron:nightly-report"
	replicas = 3
	ticks    = 2
	// ttl is far shorter than the job: the keep-alive must renew.
	ttl     = 750 * time.Millisecond
	jobTime = 1800 * time.Millisecond
)

func main() { exampledb.Main(run) }

// replica is one instance of the service.
type replica struct {
	name  string
	pool  *pgxpool.Pool
	store *lease.Store
}

// attempt is what one replica did at one tick.
type attempt struct {
	Replica string
	Ran     bool
	Token   int64         // of the lease the job ran under
	Took    time.Duration // how long the job ran
}

// tick runs the job if no other replica is running it. Reporting to tried
// once it has tried lets the demo hold the job until every replica has.
func (r *replica) tick(ctx context.Context, out io.Writer, tried *sync.WaitGroup) (attempt, error) {
	a := attempt{Replica: r.name}
	l, err := r.store.TryAcquire(ctx, job, ttl, lease.WithKeepAlive())
	tried.Done()
	var held *lease.HeldError
	if errors.As(err, &held) {
		fmt.Fprintf(out, "  %s: skip, running elsewhere (token %d, %v left)\n",
			r.name, held.Token, held.ExpiresIn.Round(time.Millisecond))
		return a, nil
	}
	if err != nil {
		return a, err
	}
	defer l.Release(context.WithoutCancel(ctx))
	fmt.Fprintf(out, "  %s: running the job under lease token %d\n", r.name, l.Token())

	// The job runs under the lease's context: it stops if the lease is lost.
	start := time.Now()
	if err := report(l.Context()); err != nil {
		return a, fmt.Errorf("%s: job: %w", r.name, err)
	}
	tried.Wait()
	a.Ran, a.Token, a.Took = true, l.Token(), time.Since(start)
	fmt.Fprintf(out, "  %s: done in %v, %.1f TTLs: the keep-alive renewed the lease\n",
		r.name, a.Took.Round(time.Millisecond), float64(a.Took)/float64(ttl))
	return a, nil
}

// report is the job: a few steps of work, each abandoned if ctx ends.
func report(ctx context.Context) error {
	for range 4 {
		select {
		case <-time.After(jobTime / 4): // ... one step of work ...
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return nil
}

// run starts the replicas and fires their schedule: at each tick, all at once.
func run(ctx context.Context, dsn string, out io.Writer) (attempts [][]attempt, err error) {
	var rs []*replica
	defer func() {
		for _, r := range rs {
			_ = r.store.Close(context.WithoutCancel(ctx))
			r.pool.Close()
		}
	}()
	for i := 1; i <= replicas; i++ {
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			return nil, err
		}
		store, err := lease.New(pool, lease.Config{})
		if err != nil {
			pool.Close()
			return nil, err
		}
		rs = append(rs, &replica{name: fmt.Sprintf("replica-%d", i), pool: pool, store: store})
	}
	if err := rs[0].store.Migrate(ctx); err != nil {
		return nil, err
	}

	fmt.Fprintf(out, "%d replicas run job %q on the same schedule (lease TTL %v, job %v)\n", replicas, job, ttl, jobTime)
	out = &lockedWriter{w: out}
	for n := 1; n <= ticks; n++ {
		fmt.Fprintf(out, "tick %d:\n", n)
		var tried, done sync.WaitGroup
		tried.Add(len(rs))
		results := make([]attempt, len(rs))
		errs := make([]error, len(rs))
		for i, r := range rs {
			done.Go(func() { results[i], errs[i] = r.tick(ctx, out, &tried) })
		}
		done.Wait()
		if err := errors.Join(errs...); err != nil {
			return attempts, err
		}
		attempts = append(attempts, results)
	}
	return attempts, nil
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
