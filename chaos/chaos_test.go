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
func TestLeaseChaos(t *testing.T) { runWorkload(t, "lease") }

// TestAdvisoryChaos runs the advisory workload, exclusive and shared, under
// every fault kind and checks the holders' verified windows.
func TestAdvisoryChaos(t *testing.T) { runWorkload(t, "advisory") }

func runWorkload(t *testing.T, workload string) {
	if testing.Short() {
		t.Skip("-short")
	}
	rc := configFromEnv(t)
	db := pgtest.New(t)
	ctx := t.Context()
	if _, err := adminPool(t, db).Exec(ctx, "insert into protected (name) select 'n' || i from generate_series(0, $1 - 1) i", rc.names); err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, db, rc.workers, fmt.Sprintf("%s=%d", envNames, rc.names), envWorkload+"="+workload)
	kinds := []string{fTerminate, fKill, fStop, fRestart, fLostReply}
	if k := os.Getenv("CHAOS_FAULTS"); k != "" {
		kinds = strings.Split(k, ",")
	}
	sched := schedule(rc.seed, rc.maxTime, rc.workers, kinds)
	t.Logf("%d faults scheduled over at most %v, first: %v", len(sched), rc.maxTime, sched[:min(5, len(sched))])
	faults := runFaults(t, c, rc, sched)
	c.shutdown()
	r := check(t, c, db, rc)
	r.faults = faults
	t.Log("\n" + r.String())
}

// runFaults plays the schedule until the workers have returned rc.ops
// operations or rc.maxTime has passed.
func runFaults(t *testing.T, c *cluster, rc runConfig, sched []fault) map[string]int {
	ctx, cancel := context.WithTimeout(t.Context(), rc.maxTime)
	defer cancel()
	res := make(chan map[string]int, 1)
	go func() { res <- play(ctx, sched, rc.seed, c, t.Logf) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-tick.C:
			if c.returned() >= rc.ops {
				cancel()
			}
		case <-ctx.Done():
		}
	}
	return <-res
}
