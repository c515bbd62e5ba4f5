package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/pgtest"
)

// patroniFaults are the Patroni leg's faults on the primary, injected with
// pgtest's Patroni.Fault one at a time, each followed by its Recover (a
// writable primary with a synchronous standby again). Append a fault here
// when pgtest offers a new one; CHAOS_FAULTS may also name any fault
// Patroni.Fault knows. Not here: pgtest.FaultPause and FaultPauseLong,
// after which Debian's Patroni 3.0.2 takes the leader key back and loses
// acknowledged commits (docs/compatibility.md) — see TestPatroniChaosPause.
var patroniFaults = []pgtest.PatroniFault{
	pgtest.FaultSwitchover, pgtest.FaultKillPostmaster, pgtest.FaultKillNode, pgtest.FaultPartition,
}

// fPrimaryPartition is the chaos kind of pgtest.FaultPartition, the
// primary cut off from etcd, clients and its standby: "partition" is the
// schedule's worker partition (fPartition).
const fPrimaryPartition = "primary-partition"

// patroniKind returns the chaos kind of a Patroni fault.
func patroniKind(f pgtest.PatroniFault) string {
	if f == pgtest.FaultPartition {
		return fPrimaryPartition
	}
	return string(f)
}

// scheduled are the fault kinds of the seeded schedule (play); in a
// Patroni leg every other kind is a Patroni fault.
var scheduled = map[string]bool{fTerminate: true, fTermHolder: true, fKill: true, fStop: true, fLostReply: true,
	fPartition: true, fRestart: true, fCrash: true, fPromote: true, fCutShort: true}

// patroniLegFaults are the Patroni leg's default kinds: the worker and
// session faults that need no proxy, a crash of the primary's server
// (recovered in place), and those of patroniFaults that p can play (a
// partition needs the nodes in network namespaces: see
// pgtest.Patroni.Supports).
func patroniLegFaults(p *pgtest.Patroni) []string {
	kinds := []string{fTerminate, fKill, fStop, fCrash}
	for _, f := range patroniFaults {
		if p.Supports(f) {
			kinds = append(kinds, patroniKind(f))
		}
	}
	return kinds
}

// patroniMaxTime bounds a Patroni leg's run at the default size: it goes
// on until it has its operations and every Patroni fault has been
// injected and recovered from once (a SIGKILLed or cut-off node is
// replaced after the leader key's TTL, 20 s, and rejoins — rewound, for a
// cut-off one — a minute or more later at a load average of 40: one
// partition took 3m22s to a synchronous standby again, and 5 minutes left
// the semaphore run's SIGKILL of the node unplayed).
const patroniMaxTime = 8 * time.Minute

// patroniOptIn skips t unless PGLOCKS_PATRONI=1: a cluster starts in some
// 20 s, and a run lasts minutes.
func patroniOptIn(t *testing.T) {
	t.Helper()
	if os.Getenv("PGLOCKS_PATRONI") != "1" {
		t.Skip("Patroni chaos is opt-in: set PGLOCKS_PATRONI=1")
	}
	if testing.Short() {
		t.Skip("-short")
	}
}

// TestPatroniChaos runs the lease, advisory, leader and semaphore
// workloads, one after another, on one Patroni cluster (two nodes,
// synchronous mode), half of each run's workers on its multi-host DSN and
// half through HAProxy, under switchovers, SIGKILLs of the primary's
// postmaster and of the whole node, partitions of the primary (where the
// nodes run in network namespaces), crashes of the primary's server and
// the worker faults; reads lock the row they read, as in
// TestLeasePromoteChaos. The oracles are the suite's: in synchronous mode
// no acknowledged acquisition or write may be lost, so no token is handed
// out twice. Each run reports its failovers (fault → writable primary,
// → workers' operations acknowledged again, → synchronous standby back).
// Opt-in: PGLOCKS_PATRONI=1.
func TestPatroniChaos(t *testing.T) {
	patroniOptIn(t)
	p := pgtest.NewPatroni(t, pgtest.PatroniOptions{})
	var all []failover
	for _, w := range []struct {
		workload string
		o        runOpts
	}{{"lease", runOpts{}}, {"advisory", runOpts{}}, {"leader", runOpts{}}, {"semaphore", semaphoreOpts()}} {
		t.Run(w.workload, func(t *testing.T) {
			w.o.patroni = p
			r := run(t, w.workload, w.o)
			all = append(all, r.failovers...)
			mustHold(t, r)
		})
	}
	t.Log("\n" + failoverSummary(all))
}

// patroniRun is a run's database on a Patroni cluster, and the player of
// its Patroni faults.
type patroniRun struct {
	p     *pgtest.Patroni
	db    string
	kinds []pgtest.PatroniFault
	// leftBroken: one fault only, and no recovery (see
	// TestPatroniChaosPause); the run goes on for settle after it.
	leftBroken bool
	settle     time.Duration

	// busy is held by a Patroni fault, from the wait for a synchronous
	// standby to the end of the recovery, and by a crash (cluster.crash),
	// which is skipped while a Patroni fault is under way. A crash of the
	// primary's server ends its replication connections: until the
	// standby streams again, Patroni (rightly) names no synchronous
	// standby and promotes nobody, so that a node SIGKILLed then is not
	// replaced (seen: 4 minutes without a primary). And a crash of the
	// new primary while the old one is being rewound left the old one's
	// data directory half-copied (pg_rewind: "unexpected result while
	// fetching remote files"; then "could not load pg_hba.conf"), which
	// Patroni 3.0.2 does not repair without
	// remove_data_directory_on_rewind_failure (seen once).
	busy sync.Mutex

	mu   sync.Mutex
	done []failover
}

// patroniTarget makes a run's database on p, "chaos_<workload>", with the
// run's tables. With brokenFor, the run injects one Patroni fault, does
// not recover from it, and goes on for brokenFor after it.
func patroniTarget(t *testing.T, p *pgtest.Patroni, workload string, brokenFor time.Duration) target {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	pr := &patroniRun{p: p, db: "chaos_" + workload, leftBroken: brokenFor > 0, settle: brokenFor}
	conn, err := pgx.Connect(ctx, p.DSN())
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, "create database "+pgx.Identifier{pr.db}.Sanitize())
	_ = conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// pgx tries a multi-host DSN's next host only if this one refuses
	// for another reason than an unknown database: every node must have
	// replayed the creation first.
	if err := pr.waitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	if conn, err = pgx.Connect(ctx, pr.dsn(p.DSN())); err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	admin := pgtest.NewPool(t, pr.dsn(p.DSN()), func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["application_name"] = adminApp
	})
	return target{pat: pr, admin: admin}
}

// waitReplayed waits until every node has the run's database.
func (pr *patroniRun) waitReplayed(ctx context.Context) error {
	for _, n := range pr.p.Nodes() {
		dsn, err := pr.p.NodeDSN(n)
		if err != nil {
			return err
		}
		for {
			var ok bool
			conn, err := pgx.Connect(ctx, dsn)
			if err == nil {
				err = conn.QueryRow(ctx, "select exists (select from pg_database where datname = $1)", pr.db).Scan(&ok)
				_ = conn.Close(ctx)
			}
			if ok {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("database %s not on %s: %v", pr.db, n, err)
			}
			pause(ctx, 20*time.Millisecond)
		}
	}
	return nil
}

// dsn is dsn (one of the cluster's) naming the run's database.
func (pr *patroniRun) dsn(dsn string) string {
	base, query, _ := strings.Cut(dsn, "?")
	return base[:strings.LastIndexByte(base, '/')+1] + pr.db + "?" + query
}

// workerDSN is slot i's: the multi-host DSN for even slots, HAProxy for
// odd ones, the two ways users reach a Patroni primary.
func (pr *patroniRun) workerDSN(i int) string {
	if i%2 == 1 {
		return pr.dsn(pr.p.HAProxyDSN())
	}
	return pr.dsn(pr.p.DSN())
}

// take keeps the Patroni faults of kinds (fPrimaryPartition for
// pgtest.FaultPartition) for the run's Patroni player and returns the
// others, for the schedule.
func (pr *patroniRun) take(kinds []string) []string {
	var rest []string
	for _, k := range kinds {
		f := pgtest.PatroniFault(k)
		if k == fPrimaryPartition {
			f = pgtest.FaultPartition
		}
		switch {
		case scheduled[k]:
			rest = append(rest, k)
		case !slices.Contains(pr.kinds, f):
			pr.kinds = append(pr.kinds, f)
		}
	}
	return rest
}

// covered reports whether every Patroni fault of the run has been
// injected and recovered from at least once.
func (pr *patroniRun) covered() bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	for _, k := range pr.kinds {
		if !slices.ContainsFunc(pr.done, func(f failover) bool { return f.Kind == patroniKind(k) }) {
			return false
		}
	}
	return true
}

// play injects the run's Patroni faults until ctx ends, one at a time,
// 1–4 s after the cluster recovered from the one before: first each kind
// once, in an order drawn from seed, then kinds drawn from it. A fault in
// flight when ctx ends is completed and recovered from. It counts what it
// did, as play does.
func (pr *patroniRun) play(ctx context.Context, seed uint64, c *cluster) map[string]int {
	done := map[string]int{}
	if len(pr.kinds) == 0 {
		<-ctx.Done()
		return done
	}
	r := rand.New(rand.NewPCG(seed, 2))
	first := r.Perm(len(pr.kinds))
	for i := 0; ; i++ {
		pause(ctx, time.Duration(1000+r.IntN(3000))*time.Millisecond)
		if pr.leftBroken && i > 0 {
			<-ctx.Done()
		}
		if ctx.Err() != nil {
			return done
		}
		k := pr.kinds[r.IntN(len(pr.kinds))]
		if i < len(first) {
			k = pr.kinds[first[i]]
		}
		f, injected, err := pr.inject(ctx, k, c)
		if err != nil && !injected {
			// Refused (a switchover while Patroni names no synchronous
			// standby, say), the cluster as it was: logged, not counted.
			c.t.Logf("Patroni fault %s not injected: %v", k, err)
			continue
		}
		if err != nil {
			// The cluster did not recover: the faults that follow would
			// test nothing but that.
			c.t.Errorf("Patroni fault %s: %v", k, err)
			return done
		}
		done[patroniKind(k)]++
		c.t.Logf("Patroni %s %s → %s: writable after %v, %s", k, f.Old, f.New, ms(f.Writable), f.recovery())
	}
}

// inject injects k, waits for the cluster to recover, and records it. It
// reports whether k was injected: if not, the cluster is as it was.
func (pr *patroniRun) inject(ctx context.Context, k pgtest.PatroniFault, c *cluster) (failover, bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 4*time.Minute)
	defer cancel()
	pr.busy.Lock()
	defer pr.busy.Unlock()
	// Patroni's REST API answers from each node's cached view of the
	// DCS: the primary streaming to its synchronous standby is necessary
	// too (Patroni names a standby in its sync key only once it is).
	if _, err := pr.p.WaitSynchronous(ctx); err != nil { // after a crash, say
		return failover{}, true, err // not injected, but not as it was either
	}
	if err := pr.waitStreaming(ctx, c.admin); err != nil {
		return failover{}, true, err
	}
	at := mono()
	fo, err := pr.p.Fault(ctx, k)
	if fo == nil {
		return failover{}, false, err
	}
	f := failover{Kind: patroniKind(k), Old: fo.Old, New: fo.New, At: at, Writable: fo.Writable, Recovered: -1}
	if pr.leftBroken && err == nil {
		pause(ctx, pr.settle) // no recovery: the cluster stays as the fault left it
	} else {
		if rerr := fo.Recover(ctx); rerr != nil || err != nil {
			return f, true, fmt.Errorf("fault: %v; recover: %v", err, rerr)
		}
		f.Recovered = time.Duration(mono() - at)
	}
	c.admin.Reset() // sessions on the old primary are gone
	pr.mu.Lock()
	pr.done = append(pr.done, f)
	pr.mu.Unlock()
	return f, true, nil
}

// waitStreaming waits until the primary (admin's) has a synchronous
// standby streaming, after a crash (which ends its replication
// connections) or before a Patroni fault: until then Patroni may drop the
// standby from its sync key (a switchover is refused, a failover promotes
// nobody), and its REST API can still answer from the key as it was.
func (pr *patroniRun) waitStreaming(ctx context.Context, admin *pgxpool.Pool) error {
	for {
		var n int
		err := admin.QueryRow(ctx, "select count(*) from pg_stat_replication where state = 'streaming' and sync_state = 'sync'").Scan(&n)
		if err == nil && n > 0 {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("no synchronous standby streaming: %v", err)
		}
		pause(ctx, 50*time.Millisecond)
	}
}
