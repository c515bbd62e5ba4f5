package lease_test

import (
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// viaTransactionBouncer names the test whose subtests run the lease
// behaviour tests through a transaction-mode PgBouncer, one subtest per
// pgx exec mode: TestViaTransactionBouncer/<mode>/<test>.
const viaTransactionBouncer = "TestViaTransactionBouncer/"

var execModes = map[string]pgx.QueryExecMode{
	"cache_statement": pgx.QueryExecModeCacheStatement,
	"cache_describe":  pgx.QueryExecModeCacheDescribe,
	"describe_exec":   pgx.QueryExecModeDescribeExec,
	"exec":            pgx.QueryExecModeExec,
	"simple_protocol": pgx.QueryExecModeSimpleProtocol,
}

// poolFor opens the pool a behaviour test's store uses: directly on db, or
// through a transaction-mode PgBouncer with the exec mode the test's name
// says when it runs under TestViaTransactionBouncer. Checks through
// db.Conn still connect directly.
func poolFor(t testing.TB, db *pgtest.DB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	rest, ok := strings.CutPrefix(t.Name(), viaTransactionBouncer)
	if !ok {
		return db.NewPool(t, configure...)
	}
	mode, ok := execModes[strings.Split(rest, "/")[0]]
	if !ok {
		t.Fatalf("no exec mode in test name %q", t.Name())
	}
	_, dsn := db.Bouncer(t, pgtest.PoolTransaction)
	return pgtest.NewPool(t, dsn, append(configure, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })...)
}

// TestViaTransactionBouncer runs the lease behaviour tests through a real
// PgBouncer in transaction mode (PgBouncer 1.18 keeps no prepared
// statements there), once in each of pgx's five exec modes.
func TestViaTransactionBouncer(t *testing.T) {
	t.Parallel()
	tests := map[string]func(*testing.T){
		"TryAcquire":               TestTryAcquire,
		"TokensOnlyGrow":           TestTokensOnlyGrow,
		"ConcurrentTries":          TestConcurrentTries,
		"AcquireWaitsForRelease":   TestAcquireWaitsForRelease,
		"AcquireWakesAtExpiry":     TestAcquireWakesAtExpiry,
		"AcquireCancelled":         TestAcquireCancelled,
		"GuardStaleHolder":         TestGuardStaleHolder,
		"RenewExtends":             TestRenewExtends,
		"ReleaseTwice":             TestReleaseTwice,
		"RenewLosesLease":          TestRenewLosesLease,
		"KeepAliveRenews":          TestKeepAliveRenews,
		"KeepAliveDetectsTakeover": TestKeepAliveDetectsTakeover,
		"Inspect":                  TestInspect,
		"Do":                       TestDo,
		"BatchedReleases":          TestBatchedReleases,
		"BatchedRetakes":           TestBatchedRetakes,

		// Shared leases: readers and writers, waiters polling.
		"SharedReadersAndWriter":     TestSharedReadersAndWriter,
		"SharedWriterWokenByRelease": TestSharedWriterWokenByRelease,
	}
	for mode := range execModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			for name, test := range tests {
				t.Run(name, test)
			}
		})
	}
}

// TestAcquirePollsBehindTransactionPooling: behind a transaction-mode
// PgBouncer notifications cannot reach the store, so its listener, after a
// probe, never LISTENs nor takes interest locks, and a waiting Acquire
// polls: with an hour left on the holder's lease, a release still hands
// the lease over within a few poll intervals.
func TestAcquirePollsBehindTransactionPooling(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, dsn := db.Bouncer(t, pgtest.PoolTransaction)
	pool := pgtest.NewPool(t, dsn) // pgx's default exec mode: cache_statement
	store := newStore(t, pool, lease.Config{})
	direct := db.Conn(t)
	ctx := ctxT(t)
	var lat []time.Duration
	for i := range 10 {
		holder := mustTry(t, store, "polled", time.Hour)
		got := make(chan *lease.Lease, 1)
		go func() {
			l, err := store.Acquire(ctx, "polled", time.Hour)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		waitParkedPolling(t, store)
		if i == 0 {
			var n int
			if err := direct.QueryRow(ctx, `select count(*) from pg_locks where locktype = 'advisory'
				and database = (select oid from pg_database where datname = current_database())`).Scan(&n); err != nil || n != 0 {
				t.Fatalf("advisory locks on the server while polling: %d, %v; want none", n, err)
			}
		}
		start := time.Now()
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l := <-got
		if l == nil {
			t.FailNow()
		}
		lat = append(lat, time.Since(start))
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(lat)
	t.Logf("release → acquired by a polling waiter: p50 %v, max %v (poll interval %v ± 50%%)",
		lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond), lease.PollInterval)
	if lat[len(lat)-1] > 10*time.Second {
		t.Errorf("a polling waiter took %v", lat[len(lat)-1])
	}
}

// waitParkedPolling waits until an Acquire of s waits and s polls.
func waitParkedPolling(t testing.TB, s *lease.Store) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for lease.Parked(s) == 0 || !lease.Polling(s) {
		if time.Now().After(deadline) {
			t.Fatalf("no Acquire polling (parked %d, polling %v)", lease.Parked(s), lease.Polling(s))
		}
		runtime.Gosched()
	}
}

// TestAcquireListensBehindSessionPooling: behind a session-mode PgBouncer
// the store LISTENs as over a direct connection, and a release wakes a
// waiter at once.
func TestAcquireListensBehindSessionPooling(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, dsn := db.Bouncer(t, pgtest.PoolSession)
	store := newStore(t, pgtest.NewPool(t, dsn), lease.Config{})
	ctx := ctxT(t)
	holder, got := heldAndAwaited(t, store, "listened")
	if lease.Polling(store) {
		t.Fatal("the store polls behind a session-mode pooler")
	}
	start := time.Now()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if l := <-got; l == nil {
		t.FailNow()
	}
	t.Logf("release → acquired through session pooling in %v", time.Since(start).Round(time.Microsecond))
}

// heldAndAwaited holds name for an hour and starts an Acquire of it, and
// returns once the Acquire waits on a listening store; got receives the
// Acquire's lease (nil on error).
func heldAndAwaited(t *testing.T, store *lease.Store, name string) (holder *lease.Lease, got chan *lease.Lease) {
	t.Helper()
	holder = mustTry(t, store, name, time.Hour)
	got = make(chan *lease.Lease, 1)
	go func() {
		l, err := store.Acquire(ctxT(t), name, time.Hour)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	deadline := time.Now().Add(30 * time.Second)
	for lease.Parked(store) == 0 || !lease.Listening(store) {
		if time.Now().After(deadline) {
			t.Fatalf("no Acquire waiting on a listening store (parked %d)", lease.Parked(store))
		}
		runtime.Gosched()
	}
	return holder, got
}
