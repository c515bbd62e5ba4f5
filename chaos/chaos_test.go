package chaos

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

func TestMain(m *testing.M) {
	if runWorker() {
		return
	}
	pgtest.Main(m, pgtest.WithTemplate(migrate))
}

// migrate creates a run's tables: the lease table and the protected rows.
func migrate(ctx context.Context, conn *pgx.Conn) error {
	ddl, err := lease.SchemaSQL(lease.Config{})
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, ddl); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "create table protected (name text primary key, val bigint not null default 0, n bigint not null default 0)")
	return err
}

// runDB returns a run's database, on a private server, so that the run's
// restarts and crashes reach no other test and runs can go in parallel.
// With PGTEST_DSN it is on the user's server (restart and crash faults
// then fail, and are logged).
func runDB(t *testing.T) *pgtest.DB {
	if os.Getenv("PGTEST_DSN") != "" {
		return pgtest.New(t)
	}
	return pgtest.NewServer(t, pgtest.WithTemplate(migrate)).NewDB(t)
}

// runClusterDB is runDB on a primary with a synchronous standby.
func runClusterDB(t *testing.T) (*pgtest.DB, *pgtest.Cluster) {
	ha := pgtest.NewCluster(t, pgtest.WithSynchronousStandby(), pgtest.WithTemplate(migrate))
	return ha.NewDB(t), ha
}

// runConfig is a run's size and seed, from the environment.
type runConfig struct {
	seed    uint64
	ops     int           // returned operations to reach
	maxTime time.Duration // stop then even if ops were not reached
	workers int
	names   int
	counted string // the operation whose returns make ops ("": every one)
}

func configFromEnv(t *testing.T) runConfig {
	rc := runConfig{seed: rand.Uint64(), ops: 2000, maxTime: 40 * time.Second, workers: 3, names: 4}
	if s, err := strconv.ParseUint(os.Getenv("CHAOS_SEED"), 10, 64); err == nil {
		rc.seed = s
	}
	if n, err := strconv.Atoi(os.Getenv("CHAOS_OPS")); err == nil && n > 0 {
		rc.ops = n
		rc.maxTime = time.Duration(n/25+20) * time.Second
	}
	t.Logf("CHAOS_SEED=%d CHAOS_OPS=%d (replay with these)", rc.seed, rc.ops)
	return rc
}

// TestLeaseChaos runs the lease workload under every fault kind and checks
// its history.
func TestLeaseChaos(t *testing.T) { mustHold(t, run(t, "lease", runOpts{})) }

// TestAdvisoryChaos runs the advisory workload, exclusive and shared, under
// every fault kind and checks the holders' verified windows.
func TestAdvisoryChaos(t *testing.T) { mustHold(t, run(t, "advisory", runOpts{})) }

// TestLeaderChaos runs the leader workload (one candidate per election in
// every worker, fenced writes per term) under every fault kind and checks
// its history with the same fenced-lock model: terms are acquisitions.
func TestLeaderChaos(t *testing.T) { mustHold(t, run(t, "leader", runOpts{})) }

// TestSemaphoreChaos runs the semaphore workload, 8 clients in each of 4
// worker processes on two semaphores of limit 3 (a lease semaphore and an
// advisory one), under every fault kind and terminations of advisory
// permit holders' sessions: per slot, the fenced-lock model; per
// semaphore, never more than 3 permits trusted at once. Its size is
// counted in acquisitions of the lease semaphore that returned, whatever
// their outcome: 200 (or 15 s), or CHAOS_OPS, or 10,000 with
// PGLOCKS_STRESS=1.
func TestSemaphoreChaos(t *testing.T) { mustHold(t, run(t, "semaphore", semaphoreOpts())) }

// semaphoreOpts is the semaphore workload's shape and size.
func semaphoreOpts() runOpts {
	return runOpts{workers: 4, goroutines: 8, counted: opPermits,
		defaultOps: 200, defaultTime: 15 * time.Second, stressOps: 10000, extraFaults: []string{fTermHolder}}
}

// TestLeasePromoteChaos runs the lease workload on a primary with a
// synchronous standby, the workers connected through its multi-host DSN,
// under promotions (the primary stopped at once, the standby promoted, the
// old primary rejoined as the standby), crashes, restarts, kills, stops
// and terminations: no acknowledged acquisition or write may be lost, and
// no token handed out twice. Reads lock the row they read (see run): a
// plain read can see a commit that a promotion then loses.
func TestLeasePromoteChaos(t *testing.T) {
	mustHold(t, run(t, "lease", runOpts{promote: true,
		faults: []string{fPromote, fCutShort, fTerminate, fKill, fStop, fCrash, fRestart}}))
}

// TestCutShortPlainReads shows, live, why the promotion runs' reads lock
// the row: with plain reads, commits cut short and then lost by a
// promotion (fCutShort) are read before they vanish, and the checker
// reports the history as not linearizable. Opt-in (CHAOS_PLAIN_READS=1):
// it reported the anomaly in 2 of 3 default-size runs, too few to assert
// in every run; TestCheckerReportsCutShortRead checks a history it
// recorded, every time.
func TestCutShortPlainReads(t *testing.T) {
	if os.Getenv("CHAOS_PLAIN_READS") == "" {
		t.Skip("opt-in: CHAOS_PLAIN_READS=1")
	}
	r := run(t, "lease", runOpts{promote: true, plainReads: true, faults: []string{fCutShort}, stopOnViolation: true})
	if len(r.violations) == 0 {
		t.Fatalf("plain reads under cut-short promotions: no oracle reported a violation\n%s", r)
	}
	t.Logf("plain reads under cut-short promotions: reported\n%s", r)
}

// TestPlantedBugs runs the lease workload with a known bug planted in the
// library (internal/plant) and asserts that the oracles report it within
// a default run. A run stops at the first violation found.
func TestPlantedBugs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		bug    string
		faults []string
		lazy   bool
	}{
		{"guard-skips-check", []string{fTerminate}, false},
		// No guarded writes, whose synchronous commits would flush the
		// asynchronous ones, and a WAL writer that sleeps 10 s: what the
		// bug commits asynchronously is still unwritten at the crash.
		{"async-commit", []string{fCrash}, true},
	} {
		t.Run(tc.bug, func(t *testing.T) {
			r := run(t, "lease", runOpts{plant: tc.bug, faults: tc.faults, lazyWAL: tc.lazy, stopOnViolation: true})
			if len(r.violations) == 0 {
				t.Fatalf("planted %s: no oracle reported it\n%s", tc.bug, r)
			}
			t.Logf("planted %s: reported\n%s", tc.bug, r)
		})
	}
}

// mustHold fails t if the run found a violation.
func mustHold(t *testing.T, r report) {
	if len(r.violations) > 0 {
		t.Errorf("CHAOS_SEED=%d: %d violation(s):\n%s", r.seed, len(r.violations), r)
	}
}

// runOpts varies a run: a planted bug, the fault kinds (default: every
// kind, or CHAOS_FAULTS), a lazy WAL, and whether to stop at the first
// violation.
type runOpts struct {
	plant           string
	faults          []string
	lazyWAL         bool            // no guarded writes; the WAL writer sleeps 10 s
	promote         bool            // on a primary with a synchronous standby, workers without proxies
	patroni         *pgtest.Patroni // on this Patroni cluster, in a database of the run's own
	brokenFor       time.Duration   // with patroni: one Patroni fault, no recovery, the run goes on this long after it
	plainReads      bool            // with promote: reads that do not wait for the standby
	stopOnViolation bool

	workers, goroutines int      // worker processes and clients in each (default 3 and 4)
	counted             string   // the operation whose returns make the run's size (default: every one)
	extraFaults         []string // fault kinds added to the default ones or CHAOS_FAULTS
	// The size when CHAOS_OPS is not set: defaultOps operations within
	// defaultTime, or stressOps with PGLOCKS_STRESS=1 (0: the suite's).
	defaultOps  int
	defaultTime time.Duration
	stressOps   int
}

// size applies o's size and shape to rc.
func (o runOpts) size(t *testing.T, rc *runConfig) {
	rc.workers = max(rc.workers, o.workers)
	rc.counted = o.counted
	defer func() {
		if o.patroni != nil {
			// A bound only: the run ends once it has its operations and
			// has injected every Patroni fault (patroniRun.covered).
			rc.maxTime = max(rc.maxTime, patroniMaxTime)
		}
		t.Logf("size: %d %q operations within %v", rc.ops, rc.counted, rc.maxTime)
	}()
	if os.Getenv("CHAOS_OPS") != "" {
		return
	}
	switch {
	case o.stressOps > 0 && os.Getenv("PGLOCKS_STRESS") != "":
		rc.ops, rc.maxTime = o.stressOps, time.Duration(o.stressOps/15+20)*time.Second
	case o.defaultOps > 0:
		rc.ops, rc.maxTime = o.defaultOps, o.defaultTime
	}
}

// run runs a workload and returns its report.
func run(t *testing.T, workload string, o runOpts) report {
	if testing.Short() {
		t.Skip("-short")
	}
	if o.patroni == nil {
		t.Parallel() // a Patroni leg's runs take turns on its one cluster
	}
	rc := configFromEnv(t)
	o.size(t, &rc)
	if o.stopOnViolation {
		// A planted bug shows up by chance (a fault at the right moment):
		// such a run goes on until it does, within a longer bound, rather
		// than stop at the default size (a run under a CPU hog once made
		// too few operations to meet it).
		rc.ops, rc.maxTime = max(rc.ops, 20000), max(rc.maxTime, 120*time.Second)
	}
	tg := runTarget(t, workload, o)
	ctx := t.Context()
	if _, err := tg.admin.Exec(ctx, "insert into protected (name) select 'n' || i from generate_series(0, $1 - 1) i", rc.names); err != nil {
		t.Fatal(err)
	}
	if workload == "semaphore" { // a protected row per lease permit slot
		if _, err := tg.admin.Exec(ctx, "insert into protected (name) select $1 || '#' || i from generate_series(0, $2 - 1) i", semName, semLimit); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{fmt.Sprintf("%s=%d", envNames, rc.names), envWorkload + "=" + workload}
	if o.goroutines > 0 {
		env = append(env, fmt.Sprintf("%s=%d", envGoroutines, o.goroutines))
	}
	if o.plant != "" {
		env = append(env, envPlant+"="+o.plant)
	}
	if (o.promote || o.patroni != nil) && !o.plainReads {
		// A commit cut short while it waits for the synchronous standby
		// (its backend terminated) is visible on the primary at once, and
		// a promotion can then lose it (lease TestSyncCommitCutShort): a
		// plain read could return a value that the failover takes back.
		// Reads lock the row instead, so that their commits wait for the
		// standby too, as Guard's do.
		env = append(env, envDurableReads+"=1")
	}
	if o.lazyWAL {
		env = append(env, envNoWrites+"=1")
		for _, sql := range []string{"alter system set wal_writer_delay = '10s'", "select pg_reload_conf()"} {
			if _, err := tg.admin.Exec(ctx, sql); err != nil {
				t.Fatal(err)
			}
		}
	}
	c := newCluster(t, tg, rc.workers, env...)
	kinds := []string{fTerminate, fKill, fStop, fRestart, fCrash, fLostReply, fPartition}
	if o.patroni != nil {
		kinds = patroniLegFaults(o.patroni)
	}
	if k := os.Getenv("CHAOS_FAULTS"); k != "" {
		kinds = strings.Split(k, ",")
	}
	if o.faults != nil {
		kinds = o.faults
	}
	kinds = append(kinds, o.extraFaults...)
	if tg.pat != nil {
		kinds = tg.pat.take(kinds)
		t.Logf("Patroni faults: %v", tg.pat.kinds)
	}
	sched := schedule(rc.seed, rc.maxTime, rc.workers, kinds)
	t.Logf("%d faults scheduled over at most %v, first: %v", len(sched), rc.maxTime, sched[:min(5, len(sched))])
	faults := runFaults(t, c, rc, sched, o.stopOnViolation)
	c.shutdown()
	r := check(c, rc)
	r.faults, r.seed = faults, rc.seed
	if tg.pat != nil {
		r.failovers = tg.pat.failovers(c.history())
	}
	t.Log("\n" + r.String())
	return r
}

// target is where a run's workers connect: a database on a server of its
// own (db), on a primary with a synchronous standby (db and ha), or on a
// Patroni cluster (pat); admin is the harness's pool on it.
type target struct {
	db    *pgtest.DB
	ha    *pgtest.Cluster
	pat   *patroniRun
	admin *pgxpool.Pool
}

// runTarget makes a run's database: on a server of its own, on a primary
// with a synchronous standby (o.promote), or on o.patroni's cluster.
func runTarget(t *testing.T, workload string, o runOpts) target {
	switch {
	case o.patroni != nil:
		return patroniTarget(t, o.patroni, workload, o.brokenFor)
	case o.promote:
		db, ha := runClusterDB(t)
		return target{db: db, ha: ha, admin: adminPool(t, db)}
	}
	db := runDB(t)
	return target{db: db, admin: adminPool(t, db)}
}

// runFaults plays the schedule until the workers have returned rc.ops
// operations or rc.maxTime has passed, or, with stopOnViolation, until
// the history so far breaks an oracle (checked every two seconds).
func runFaults(t *testing.T, c *cluster, rc runConfig, sched []fault, stopOnViolation bool) map[string]int {
	ctx, cancel := context.WithTimeout(t.Context(), rc.maxTime)
	defer cancel()
	res := make(chan map[string]int, 2)
	go func() { res <- play(ctx, sched, rc.seed, c, t.Logf) }()
	players := 1
	if c.pat != nil {
		players++
		go func() { res <- c.pat.play(ctx, rc.seed, c) }()
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for i := 0; ctx.Err() == nil; i++ {
		select {
		case <-tick.C:
			if c.returned(rc.counted) >= rc.ops && (c.pat == nil || c.pat.covered()) {
				cancel()
			}
			if stopOnViolation && i%2 == 1 && len(analyse(c.history()).violations) > 0 {
				cancel()
			}
		case <-ctx.Done():
		}
	}
	done := map[string]int{}
	for range players {
		maps.Copy(done, <-res) // the players' kinds differ
	}
	if c.pat != nil && !c.pat.covered() {
		t.Errorf("the run ended (%v) before every Patroni fault of %v was injected and recovered from", rc.maxTime, c.pat.kinds)
	}
	return done
}
