package gocronleader_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/gocronleader"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// jobEvery is the job's interval: every replica's scheduler has its timer
// fire every jobEvery; only the leader's runs.
const jobEvery = 50 * time.Millisecond

// replica is one service instance: its own pool, leader.Elector, adapter
// and gocron scheduler, with one job that records its runs in the runs
// table (by the server clock, so runs of several processes compare).
type replica struct {
	name  string
	pool  *pgxpool.Pool
	le    *leader.Elector
	el    *gocronleader.Elector
	sched gocron.Scheduler
	onRun func(name string)

	mu   sync.Mutex
	errs []error
}

// startReplica starts a replica on dsn; onRun, if set, is called after
// each run.
func startReplica(dsn, name string, onRun func(string)) (*replica, error) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, err
	}
	r := &replica{name: name, pool: pool, onRun: onRun}
	if r.le, err = leader.New(leader.Config{Name: "gocron-jobs", Pool: pool, Identity: name, RetryInterval: 100 * time.Millisecond}); err != nil {
		pool.Close()
		return nil, err
	}
	if r.el, err = gocronleader.Start(r.le); err == nil {
		r.sched, err = gocron.NewScheduler(gocron.WithDistributedElector(r.el))
	}
	if err == nil {
		_, err = r.sched.NewJob(gocron.DurationJob(jobEvery), gocron.NewTask(r.run),
			gocron.WithName("tick"), gocron.WithSingletonMode(gocron.LimitModeReschedule))
	}
	if err != nil {
		_ = r.close(ctx)
		return nil, err
	}
	r.sched.Start()
	return r, nil
}

// run is the job: it notes the term it runs in (-1: none trusted, which
// IsLeader should have prevented), and records its start and end.
func (r *replica) run(ctx context.Context) {
	term := int64(-1)
	if t, ok := r.le.Trusted(); ok {
		term = t.Number
	}
	var id int64
	err := r.pool.QueryRow(ctx, "insert into runs (replica, term) values ($1, $2) returning id", r.name, term).Scan(&id)
	if err == nil {
		work := time.NewTimer(5 * time.Millisecond) // the job's work
		<-work.C
		_, err = r.pool.Exec(ctx, "update runs set ended = clock_timestamp() where id = $1", id)
	}
	if err != nil && ctx.Err() == nil {
		r.mu.Lock()
		r.errs = append(r.errs, err)
		r.mu.Unlock()
		return
	}
	if r.onRun != nil {
		r.onRun(r.name)
	}
}

// close shuts the scheduler down (no run under way), then the adapter,
// which resigns a leader, then the election and the pool.
func (r *replica) close(ctx context.Context) error {
	var err error
	if r.sched != nil {
		err = r.sched.Shutdown()
	}
	if r.el != nil {
		err = errors.Join(err, r.el.Close(ctx))
	}
	err = errors.Join(err, r.le.Close(ctx))
	r.pool.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	return errors.Join(append(r.errs, err)...)
}

// setup makes a database with the lease table and the runs table.
func setup(t *testing.T, ctx context.Context) *pgtest.DB {
	t.Helper()
	db := pgtest.New(t)
	pool := db.NewPool(t)
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close(ctx)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `create table runs (id bigserial primary key, replica text not null,
		term bigint not null, started timestamptz not null default clock_timestamp(), ended timestamptz)`); err != nil {
		t.Fatal(err)
	}
	return db
}

// tracker counts the in-process replicas' runs, for waiting on them.
type tracker struct {
	mu      sync.Mutex
	runs    map[string]int
	changed chan struct{}
}

func newTracker() *tracker { return &tracker{runs: map[string]int{}, changed: make(chan struct{})} }

func (tr *tracker) add(name string) {
	tr.mu.Lock()
	tr.runs[name]++
	close(tr.changed)
	tr.changed = make(chan struct{})
	tr.mu.Unlock()
}

// wait returns once cond holds for the run counts, failing t after a
// minute.
func (tr *tracker) wait(t *testing.T, what string, cond func(runs map[string]int) bool) {
	t.Helper()
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for {
		tr.mu.Lock()
		ok, changed := cond(tr.runs), tr.changed
		tr.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// checkRuns checks every recorded run: each ran in a trusted term, each
// term on one replica, terms never going back, and no two replicas' runs
// overlapping in time (by the server clock). A killed replica's last run
// has no end; it counts as ended at its start.
func checkRuns(t *testing.T, ctx context.Context, conn *pgx.Conn) {
	t.Helper()
	type run struct {
		replica    string
		term       int64
		start, end time.Time
	}
	rows, err := conn.Query(ctx, "select replica, term, started, coalesce(ended, started) from runs order by started, id")
	if err != nil {
		t.Fatal(err)
	}
	runs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (run, error) {
		var r run
		return r, row.Scan(&r.replica, &r.term, &r.start, &r.end)
	})
	if err != nil {
		t.Fatal(err)
	}
	owner := map[int64]string{}
	perReplica := map[string]int{}
	for i, r := range runs {
		perReplica[r.replica]++
		if r.term < 0 {
			t.Errorf("run %d on %s outside a trusted term", i, r.replica)
		}
		if o, ok := owner[r.term]; ok && o != r.replica {
			t.Errorf("term %d ran on %s and %s", r.term, o, r.replica)
		}
		owner[r.term] = r.replica
		if i > 0 && r.term < runs[i-1].term {
			t.Errorf("run %d: term %d after term %d", i, r.term, runs[i-1].term)
		}
		for _, p := range runs[:i] {
			if p.replica != r.replica && r.start.Before(p.end) {
				t.Errorf("runs overlap: %s %v–%v and %s from %v", p.replica, p.start, p.end, r.replica, r.start)
			}
		}
	}
	t.Logf("%d runs, per replica %v, terms %v", len(runs), perReplica, fmt.Sprint(owner))
}

// sampler calls IsLeader on each replica in turn, about every millisecond,
// until stopped, so that overlapping trusted terms can be caught in the
// act (see overlap).
type sampler struct {
	stop    chan struct{}
	done    chan struct{}
	samples []sample
}

// sample is one IsLeader call: term is the term IsLeader vouched for, 0
// when it returned an error.
type sample struct {
	replica int
	term    int64
}

func startSampler(rs []*replica) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			for i, r := range rs {
				var term int64
				if r.el.IsLeader(context.Background()) == nil {
					if t, ok := r.le.Current(); ok {
						term = t.Number
					}
				}
				s.samples = append(s.samples, sample{i, term})
			}
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// finish stops the sampler and returns an error if two replicas' trusted
// terms overlapped: replica A vouched for term N at two samples (so it
// trusted N all along, a trust that lapses never comes back) and another
// replica vouched for a term between them.
func (s *sampler) finish() (int, error) {
	close(s.stop)
	<-s.done
	last := map[int]int{} // replica → index of its previous sample
	for k, b := range s.samples {
		i, seen := last[b.replica]
		last[b.replica] = k
		if !seen || b.term == 0 || s.samples[i].term != b.term {
			continue
		}
		for _, m := range s.samples[i+1 : k] {
			if m.term != 0 {
				return len(s.samples), fmt.Errorf("replica %d trusted term %d between two samples of replica %d trusting term %d",
					m.replica, m.term, b.replica, b.term)
			}
		}
	}
	return len(s.samples), nil
}
