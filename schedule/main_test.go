package schedule_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/schedule"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if runChild() {
		return
	}
	goleak.VerifyTestMain(pgtest.WrapMain(m, pgtest.WithTemplate(migrate)))
}

// migrate creates the lease and run tables, and the table the tests' jobs
// write to: one row per run of a job, with no unique key, so that a second
// run of a slot would show.
func migrate(ctx context.Context, conn *pgx.Conn) error {
	leases, err := lease.SchemaSQL(lease.Config{})
	if err != nil {
		return err
	}
	runs, err := schedule.SchemaSQL(schedule.Config{})
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, leases+runs+`create table done (job text, slot text, replica text, token bigint,
		at timestamptz default clock_timestamp())`)
	return err
}

// replica is one instance of a service: its own pool, lease store (with
// its own clock, skewed) and runner, as a separate process would have.
type replica struct {
	name   string
	skew   time.Duration
	pool   *pgxpool.Pool
	store  *lease.Store
	runner *schedule.Runner
}

// now is the replica's clock: real time + its skew (with Go's monotonic
// reading, which the lease store needs).
func (r *replica) now() time.Time { return time.Now().Add(r.skew) }

// newReplica makes a replica on db, closed when the test ends.
func newReplica(t testing.TB, db *pgtest.DB, name string, skew time.Duration) *replica {
	t.Helper()
	return newSkewedReplica(t, db.NewPool(t), name, skew)
}

// newReplicaOn makes a replica on pool, its clock not skewed.
func newReplicaOn(t testing.TB, pool *pgxpool.Pool, name string) *replica {
	t.Helper()
	return newSkewedReplica(t, pool, name, 0)
}

func newSkewedReplica(t testing.TB, pool *pgxpool.Pool, name string, skew time.Duration) *replica {
	t.Helper()
	r := &replica{name: name, skew: skew, pool: pool}
	store, err := lease.New(r.pool, lease.Config{Hostname: name, Now: r.now})
	if err != nil {
		t.Fatal(err)
	}
	r.store = store
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := store.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	if r.runner, err = schedule.New(schedule.Config{Store: store, Pool: r.pool}); err != nil {
		t.Fatal(err)
	}
	return r
}

// job makes the replica's job, failing the test on error.
func (r *replica) job(t testing.TB, name string, p schedule.Policy) *schedule.Job {
	t.Helper()
	j, err := r.runner.Job(name, p)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// work is a job's body: it writes one row to done, guarded by the run's
// lease, so that the row commits only while the run holds the job.
func (r *replica) work(ctx context.Context, run *schedule.Run) error {
	return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if err := run.Lease().Guard(ctx, tx); err != nil {
			return err
		}
		rec := run.Record()
		_, err := tx.Exec(ctx, `insert into done (job, slot, replica, token) values ($1, $2, $3, $4)`,
			pgx.QueryExecModeExec, rec.Job, rec.Slot, r.name, rec.Token)
		return err
	})
}

// doneCount returns how many runs of job's slot wrote to done.
func doneCount(t testing.TB, pool *pgxpool.Pool, job, slot string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `select count(*) from done where job = $1 and slot = $2`,
		pgx.QueryExecModeExec, job, slot).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// serverNow reads the server's clock.
func serverNow(t testing.TB, pool *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	if err := pool.QueryRow(context.Background(), `select clock_timestamp()`, pgx.QueryExecModeExec).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// slotOf is the test's own oracle for the slot of server time at.
func slotOf(at time.Time, period, tolerance time.Duration) time.Time {
	us := at.UnixMicro() + tolerance.Microseconds()
	p := period.Microseconds()
	return time.UnixMicro(us / p * p).UTC()
}

// awaitRoom waits until the server's current slot of period has at least
// room left before its window closes, and returns that slot's start.
func awaitRoom(t testing.TB, pool *pgxpool.Pool, period, tolerance, room time.Duration) time.Time {
	t.Helper()
	now := serverNow(t, pool)
	start := slotOf(now, period, tolerance)
	if left := start.Add(period - tolerance).Sub(now); left < room {
		<-time.After(left + tolerance) // the next slot's start, by the server clock
		now = serverNow(t, pool)
		start = slotOf(now, period, tolerance)
	}
	return start
}

// awaitNext waits until the server's clock is in the window of the slot
// after the current one, and returns that slot's start.
func awaitNext(t testing.TB, pool *pgxpool.Pool, period, tolerance time.Duration) time.Time {
	t.Helper()
	now := serverNow(t, pool)
	next := slotOf(now, period, tolerance).Add(period)
	<-time.After(next.Add(-tolerance).Sub(now) + 10*time.Millisecond) // by the server clock
	if got := slotOf(serverNow(t, pool), period, tolerance); !got.Equal(next) {
		t.Fatalf("waited for slot %v, server is in %v", next, got)
	}
	return next
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
