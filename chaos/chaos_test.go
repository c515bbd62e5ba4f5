package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

func TestMain(m *testing.M) {
	if runWorker() {
		return
	}
	pgtest.Main(m, pgtest.WithTemplate(func(ctx context.Context, conn *pgx.Conn) error {
		ddl, err := lease.SchemaSQL(lease.Config{})
		if err != nil {
			return err
		}
		if _, err := conn.Exec(ctx, ddl); err != nil {
			return err
		}
		_, err = conn.Exec(ctx, "create table protected (name text primary key, val bigint not null default 0, n bigint not null default 0)")
		return err
	}))
}

// runConfig is a run's size and seed, from the environment.
type runConfig struct {
	seed    uint64
	ops     int           // returned operations to reach
	maxTime time.Duration // stop then even if ops were not reached
	workers int
	names   int
}

func configFromEnv(t *testing.T) runConfig {
	rc := runConfig{seed: rand.Uint64(), ops: 2000, maxTime: 40 * time.Second, workers: 3, names: 4}
	if s, err := strconv.ParseUint(os.Getenv("CHAOS_SEED"), 10, 64); err == nil {
		rc.seed = s
	}
	if n, err := strconv.Atoi(os.Getenv("CHAOS_OPS")); err == nil && n > 0 {
		rc.ops = n
		rc.maxTime = time.Duration(n/50+20) * time.Second
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

// TestPlantedBugs runs the lease workload with a known bug planted in the
// library (internal/plant) and asserts that the oracles report it within
// a default run. A run stops at the first violation found.
func TestPlantedBugs(t *testing.T) {
	for _, tc := range []struct {
		bug    string
		faults []string
		spread int
	}{
		{"guard-skips-check", []string{fTerminate}, 1},
		{"async-commit", []string{fCrash}, 1},
	} {
		t.Run(tc.bug, func(t *testing.T) {
			r := run(t, "lease", runOpts{plant: tc.bug, faults: tc.faults, spread: tc.spread, stopOnViolation: true})
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
// kind, or CHAOS_FAULTS) and their density, and whether to stop at the
// first violation.
type runOpts struct {
	plant           string
	faults          []string
	spread          int // faults are this many times sparser (default 1)
	stopOnViolation bool
}

// run runs a workload and returns its report.
func run(t *testing.T, workload string, o runOpts) report {
	if testing.Short() {
		t.Skip("-short")
	}
	rc := configFromEnv(t)
	db := pgtest.New(t)
	ctx := t.Context()
	if _, err := adminPool(t, db).Exec(ctx, "insert into protected (name) select 'n' || i from generate_series(0, $1 - 1) i", rc.names); err != nil {
		t.Fatal(err)
	}
	env := []string{fmt.Sprintf("%s=%d", envNames, rc.names), envWorkload + "=" + workload}
	if o.plant != "" {
		env = append(env, envPlant+"="+o.plant)
	}
	c := newCluster(t, db, rc.workers, env...)
	kinds := []string{fTerminate, fKill, fStop, fRestart, fCrash, fLostReply}
	if k := os.Getenv("CHAOS_FAULTS"); k != "" {
		kinds = strings.Split(k, ",")
	}
	if o.faults != nil {
		kinds = o.faults
	}
	sched := schedule(rc.seed, rc.maxTime, rc.workers, kinds, o.spread)
	t.Logf("%d faults scheduled over at most %v, first: %v", len(sched), rc.maxTime, sched[:min(5, len(sched))])
	faults := runFaults(t, c, rc, sched, o.stopOnViolation)
	c.shutdown()
	r := check(c, rc)
	r.faults, r.seed = faults, rc.seed
	t.Log("\n" + r.String())
	return r
}

// runFaults plays the schedule until the workers have returned rc.ops
// operations or rc.maxTime has passed, or, with stopOnViolation, until
// the history so far breaks an oracle (checked every two seconds).
func runFaults(t *testing.T, c *cluster, rc runConfig, sched []fault, stopOnViolation bool) map[string]int {
	ctx, cancel := context.WithTimeout(t.Context(), rc.maxTime)
	defer cancel()
	res := make(chan map[string]int, 1)
	go func() { res <- play(ctx, sched, rc.seed, c, t.Logf) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for i := 0; ctx.Err() == nil; i++ {
		select {
		case <-tick.C:
			if c.returned() >= rc.ops {
				cancel()
			}
			if stopOnViolation && i%2 == 1 && len(analyse(c.history()).violations) > 0 {
				cancel()
			}
		case <-ctx.Done():
		}
	}
	return <-res
}
