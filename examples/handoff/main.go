// Command handoff shows a lock handed from one process to another: an API
// acquires the lease "export:<report>", puts the lease's [lease.Handle] (its
// name, owner and fencing token, as text) into a queue job and answers at
// once; a worker takes the job, resumes the lease from the handle, does the
// work under it and releases it. Meanwhile a second request for the same
// report is refused, although the API process is gone.
//
//	go run ./examples/handoff
//
// The API and the worker each have their own pool and [lease.Store], as
// separate processes would. It runs on a throwaway PostgreSQL; with -dsn
// URL it runs in a schema of its own in that database (its lease and job
// tables), dropped at the end.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglocks/pglocks/examples/internal/exampledb"
	"github.com/pglocks/pglocks/lease"
)

// ttl is how long a job may wait in the queue plus run, unless renewed.
const ttl = 30 * time.Second

const schema = `
create table if not exists handoff_jobs (
	id           bigserial primary key,
	report       text not null,
	lease_handle text not null,
	taken        boolean not null default false,
	done         boolean not null default false
);
create table if not exists handoff_exports (
	report      text not null,
	lease_token bigint not null
);`

func main() { exampledb.Main(run) }

// process is a pool and a lease store: what each process has.
type process struct {
	pool  *pgxpool.Pool
	store *lease.Store
}

func start(ctx context.Context, db exampledb.Target) (*process, error) {
	pool, err := pgxpool.New(ctx, db.DSN)
	if err != nil {
		return nil, err
	}
	store, err := lease.New(pool, lease.Config{Schema: db.Schema})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &process{pool: pool, store: store}, nil
}

// exit ends the process. Closing a store does not release its leases.
func (p *process) exit(ctx context.Context) {
	_ = p.store.Close(ctx)
	p.pool.Close()
}

// requestExport is the API's handler: it takes the report's lease and queues
// a job carrying the lease's handle. The lease is not released here: the
// worker will release it.
func (p *process) requestExport(ctx context.Context, report string) (*lease.Lease, int64, error) {
	l, err := p.store.TryAcquire(ctx, "export:"+report, ttl)
	if err != nil {
		return nil, 0, err // errors.Is(err, lease.ErrHeld): already being exported
	}
	handle, err := l.Handle().MarshalText()
	if err != nil {
		return nil, 0, err
	}
	var id int64
	if err := p.pool.QueryRow(ctx,
		`insert into handoff_jobs (report, lease_handle) values ($1, $2) returning id`, report, handle,
	).Scan(&id); err != nil {
		return nil, 0, errors.Join(err, l.Release(context.WithoutCancel(ctx)))
	}
	return l, id, nil
}

// work is the worker: it takes the next job, resumes its lease from the
// handle, does the export under it and releases it. A job whose lease expired
// while it was queued is dropped: the lease may be someone else's now.
func (p *process) work(ctx context.Context, out io.Writer) (*lease.Lease, error) {
	for {
		var id int64
		var text string
		if err := p.pool.QueryRow(ctx, `
			update handoff_jobs set taken = true
			where id = (select id from handoff_jobs where not taken order by id limit 1 for update skip locked)
			returning id, lease_handle`,
		).Scan(&id, &text); err != nil {
			return nil, fmt.Errorf("take a job: %w", err)
		}
		h, err := lease.ParseHandle(text)
		if err != nil {
			return nil, err
		}
		// Resume renews the lease now, and keeps renewing it while we work.
		l, err := p.store.Resume(ctx, h, lease.WithKeepAlive())
		if errors.Is(err, lease.ErrNotHeld) {
			fmt.Fprintf(out, "worker: job %d: lease expired in the queue, dropped\n", id)
			continue
		}
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(out, "worker: took job %d, resumed lease %q with token %d\n", id, l.Name(), l.Token())
		err = p.export(ctx, l, id)
		return l, errors.Join(err, l.Release(context.WithoutCancel(ctx)))
	}
}

// export does job id's work and records it, fenced by l: the record commits
// only while l is held.
func (p *process) export(ctx context.Context, l *lease.Lease, id int64) error {
	// ... export the report ...
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if err := l.Guard(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx,
			`insert into handoff_exports (report, lease_token) select report, $2 from handoff_jobs where id = $1`,
			id, l.Token()); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `update handoff_jobs set done = true where id = $1`, id)
		return err
	})
}

// trip is what run saw.
type trip struct {
	APIToken, WorkerToken int64
	// Refused is the error of the second request, sent while the job waited.
	Refused error
	// After is the lease's state once the worker was done.
	After lease.Info
}

func run(ctx context.Context, db exampledb.Target, out io.Writer) (res trip, err error) {
	api, err := start(ctx, db)
	if err != nil {
		return res, err
	}
	defer api.exit(context.WithoutCancel(ctx))
	if err := api.store.Migrate(ctx); err != nil {
		return res, err
	}
	if _, err := api.pool.Exec(ctx, schema); err != nil {
		return res, err
	}
	report := "report-" + uuid.NewString()[:8]

	l, job, err := api.requestExport(ctx, report)
	if err != nil {
		return res, err
	}
	res.APIToken = l.Token()
	fmt.Fprintf(out, "api:    lease %q token %d, queued job %d with handle %s\n", l.Name(), l.Token(), job, l.Handle())
	_, _, res.Refused = api.requestExport(ctx, report)
	var held *lease.HeldError
	if !errors.As(res.Refused, &held) {
		return res, fmt.Errorf("second request: got %v, want lease.ErrHeld", res.Refused)
	}
	fmt.Fprintf(out, "api:    second request for %s refused: being exported (token %d, %v left)\n",
		report, held.Token, held.ExpiresIn.Round(time.Second))
	api.exit(ctx)
	fmt.Fprintf(out, "api:    exits without releasing the lease\n")

	worker, err := start(ctx, db)
	if err != nil {
		return res, err
	}
	defer worker.exit(context.WithoutCancel(ctx))
	wl, err := worker.work(ctx, out)
	if err != nil {
		return res, err
	}
	res.WorkerToken = wl.Token()
	fmt.Fprintf(out, "worker: exported %s under token %d, released the lease\n", report, wl.Token())

	if res.After, err = worker.store.Get(ctx, l.Name()); err != nil {
		return res, err
	}
	state := "free"
	if res.After.Held {
		state = "still held"
	}
	fmt.Fprintf(out, "lease %q is %s (last token %d)\n", res.After.Name, state, res.After.Token)
	return res, nil
}
