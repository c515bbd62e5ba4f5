package schedule

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/internal/outcome"
	"github.com/pglocks/pglocks/lease"
)

// Runner runs jobs once per slot over one lease store and one run table.
// It is safe for concurrent use and holds no goroutine or connection of
// its own: its runs' leases are the store's. Make it with [New].
type Runner struct {
	cfg  Config
	q    queries
	exec bool // pass pgx.QueryExecModeExec: the pool caches statements
}

var (
	errNilRunner  = outcome.MarkFatal(errors.New("schedule: nil *Runner (make one with schedule.New)"))
	errZeroRunner = outcome.MarkFatal(errors.New("schedule: zero Runner (make one with schedule.New)"))
	errNilJob     = outcome.MarkFatal(errors.New("schedule: nil *Job (make one with Runner.Job)"))
	errZeroJob    = outcome.MarkFatal(errors.New("schedule: zero Job (make one with Runner.Job)"))
	errNilCtx     = outcome.MarkFatal(errors.New("schedule: nil context"))
)

// New returns a runner configured by cfg. It does not touch the database:
// run [Runner.Migrate] or the DDL of [SchemaSQL] (and lease.SchemaSQL)
// first.
func New(cfg Config) (*Runner, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// Statements run in exec mode unless the pool asks for another mode
	// that needs no server-side statement cache: a cached statement would
	// fail behind a transaction-mode pooler.
	mode := cfg.Pool.Config().ConnConfig.DefaultQueryExecMode
	return &Runner{cfg: cfg, q: newQueries(cfg),
		exec: mode == pgx.QueryExecModeCacheStatement || mode == pgx.QueryExecModeCacheDescribe}, nil
}

// usable returns nil for a Runner made by New.
func (r *Runner) usable() error {
	switch {
	case r == nil:
		return errNilRunner
	case r.cfg.Store == nil:
		return errZeroRunner
	}
	return nil
}

// args returns a statement's arguments, led by the exec mode if needed.
func (r *Runner) args(a ...any) []any {
	if r.exec {
		return append([]any{pgx.QueryExecModeExec}, a...)
	}
	return a
}

// Job returns the job name, run by policy p. Every replica must use the
// same name and policy for a job. An error wrapping [ErrInvalid] names the
// field of p, or the rule of the name it breaks: 1 to [MaxJobLen] bytes of
// valid UTF-8 without NUL.
func (r *Runner) Job(name string, p Policy) (*Job, error) {
	if err := r.usable(); err != nil {
		return nil, err
	}
	if err := checkText("job name", name); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("job %q: %w", name, err)
	}
	p = p.withDefaults()
	if ttl, _ := p.leaseTTL(); ttl > r.cfg.Store.Config().MaxTTL {
		return nil, fmt.Errorf("job %q: %w", name, invalid("a run's lease would last %v (Policy.AtMost or TTL), above the store's Config.MaxTTL (%v)",
			ttl, r.cfg.Store.Config().MaxTTL))
	}
	return &Job{r: r, name: name, lease: LeasePrefix + name, policy: p}, nil
}

// History returns the newest n runs of job, newest first — of every job,
// by job name, when job is "" — as the run table keeps them (at most
// Config.History per job). A run recorded as running whose lease is no
// longer held by it is reported as [Crashed]. For tools such as pglocks
// status. ctx bounds the queries.
func (r *Runner) History(ctx context.Context, job string, n int) ([]Record, error) {
	if err := r.usable(); err != nil {
		return nil, err
	}
	if ctx == nil {
		return nil, errNilCtx
	}
	if job != "" {
		if err := checkText("job name", job); err != nil {
			return nil, err
		}
	}
	if n < 1 {
		return nil, invalid("history of %d runs: ask for at least 1", n)
	}
	rows, err := r.cfg.Pool.Query(ctx, r.q.history, r.args(job, n)...)
	if err != nil {
		return nil, fmt.Errorf("schedule: history: %w", r.explain(err))
	}
	var recs []Record
	for rows.Next() {
		var name string
		rec, _, err := scanRecord("", rows.Scan, &name)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("schedule: history: %w", r.explain(err))
		}
		rec.Job = name
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("schedule: history: %w", r.explain(err))
	}
	for i, rec := range recs {
		if rec.Outcome == Running {
			if recs[i], err = r.settle(ctx, rec); err != nil {
				return nil, fmt.Errorf("schedule: history: %w", r.explain(err))
			}
		}
	}
	return recs, nil
}

// settle tells whether a run recorded as running runs still: it does while
// its lease is held with its token. If not, the record is read again — a
// run records its end before it releases its lease, so a run that ended
// meanwhile shows its end — and one still running is reported as Crashed.
func (r *Runner) settle(ctx context.Context, rec Record) (Record, error) {
	info, err := r.cfg.Store.Get(ctx, LeasePrefix+rec.Job)
	if err != nil && !errors.Is(err, lease.ErrNotFound) {
		return rec, err
	}
	if info.Held && info.Token == rec.Token {
		return rec, nil
	}
	again, ok, err := scanRecord(rec.Job, r.cfg.Pool.QueryRow(ctx, r.q.row, r.args(rec.Job, rec.Token)...).Scan)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return rec, err
	}
	if !ok { // pruned meanwhile
		again = rec
	}
	if again.Outcome == Running {
		again.Outcome = Crashed
	}
	return again, nil
}

// cleanupTimeout bounds the statements that end a run or undo a start,
// which run on a context detached from the caller's.
const cleanupTimeout = 30 * time.Second

// detached returns a context for cleanup after ctx: not cancelled with
// it, bounded by d.
func detached(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}
