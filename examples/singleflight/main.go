// Command singleflight shows duplicate requests, spread over several
// processes, that compute an expensive result once, with package
// singleflight: each request looks in a results table; on a miss it waits
// for the advisory lock on the key, looks again — another process may have
// filled it meanwhile — and only then computes and stores the result, under
// the lock.
//
//	go run ./examples/singleflight
//
// The processes are simulated by a pool and an [advisory.Locker] each, as
// separate processes would have. It runs on a throwaway PostgreSQL; with
// -dsn URL it runs in a schema of its own in that database (its results
// table), dropped at the end.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/examples/internal/exampledb"
	"github.com/pglocks/pglocks/singleflight"
)

const (
	processes = 3
	requests  = 3 // per process, at once
	// computeTime is how long the expensive computation takes.
	computeTime = 300 * time.Millisecond
)

func main() { exampledb.Main(run) }

// process is one process of the service.
type process struct {
	name     string
	pool     *pgxpool.Pool
	locker   *advisory.Locker
	group    *singleflight.Group
	computed atomic.Int64 // how often this process computed
}

// get returns the value for key: from the stored results, or computed once
// across all processes (package singleflight, results in a table).
func (p *process) get(ctx context.Context, key string) (string, singleflight.Source, error) {
	v, from, err := p.group.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
		s, err := p.compute(ctx, key)
		return []byte(s), err
	})
	return string(v), from, err
}

// compute is the expensive part.
func (p *process) compute(ctx context.Context, key string) (string, error) {
	p.computed.Add(1)
	select {
	case <-time.After(computeTime):
		return strings.ToUpper(key), nil
	case <-ctx.Done():
		return "", context.Cause(ctx)
	}
}

// tally is what run saw.
type tally struct {
	Requests, Computed, Waited, Hits int
	// Computations counts the calls of compute, in all processes.
	Computations int64
	Values       map[string]int
}

// run sends every process several concurrent requests for one key.
func run(ctx context.Context, db exampledb.Target, out io.Writer) (res tally, err error) {
	var ps []*process
	defer func() {
		for _, p := range ps {
			_ = p.locker.Close(context.WithoutCancel(ctx))
			p.pool.Close()
		}
	}()
	for i := 1; i <= processes; i++ {
		pool, err := pgxpool.New(ctx, db.DSN)
		if err != nil {
			return res, err
		}
		locker, err := advisory.New(pool, advisory.Config{ApplicationName: fmt.Sprintf("singleflight-%d", i)})
		if err != nil {
			pool.Close()
			return res, err
		}
		table, err := singleflight.NewTable(pool, db.Schema, "")
		if err != nil {
			return res, err
		}
		group := &singleflight.Group{Locker: locker, Results: table, TTL: time.Hour}
		ps = append(ps, &process{name: fmt.Sprintf("process-%d", i), pool: pool, locker: locker, group: group})
	}
	if err := ps[0].group.Results.(*singleflight.Table).Migrate(ctx); err != nil {
		return res, err
	}
	key := "quote:" + uuid.NewString()[:8]
	fmt.Fprintf(out, "%d processes × %d concurrent requests for %q; computing takes %v\n", processes, requests, key, computeTime)

	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs []error
	res.Values = map[string]int{}
	start := time.Now()
	for _, p := range ps {
		for range requests {
			wg.Go(func() {
				v, from, err := p.get(ctx, key)
				mu.Lock()
				defer mu.Unlock()
				res.Requests++
				switch {
				case err != nil:
					errs = append(errs, fmt.Errorf("%s: %w", p.name, err))
				case from == singleflight.Computed:
					res.Computed++
					fmt.Fprintf(out, "%s computed %q under the lock and stored it\n", p.name, v)
				case from == singleflight.Waited:
					res.Waited++
				default:
					res.Hits++
				}
				res.Values[v]++
			})
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	for _, p := range ps {
		res.Computations += p.computed.Load()
	}
	fmt.Fprintf(out, "%d requests in %v: %d computed, %d reused the stored result (%d after waiting for the lock, %d from the cache at once)\n",
		res.Requests, time.Since(start).Round(10*time.Millisecond), res.Computed, res.Waited+res.Hits, res.Waited, res.Hits)
	return res, nil
}
