package chaos

import (
	"context"
	"fmt"
	"maps"
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
	pgtest.FaultSwitchover, pgtest.FaultKillPostmaster, pgtest.FaultKillNode,
}

// scheduled are the fault kinds of the seeded schedule (play); in a
// Patroni leg every other kind is a Patroni fault.
var scheduled = map[string]bool{fTerminate: true, fTermHolder: true, fKill: true, fStop: true, fLostReply: true,
	fPartition: true, fRestart: true, fCrash: true, fPromote: true, fCutShort: true}

// patroniLegFaults are the Patroni leg's default kinds: the worker and
// session faults that need no proxy, a crash of the primary's server
// (recovered in place), and patroniFaults.
func patroniLegFaults() []string {
	kinds := []string{fTerminate, fKill, fStop, fCrash}
	for _, f := range patroniFaults {
		kinds = append(kinds, string(f))
	}
	return kinds
}

// patroniMaxTime bounds a Patroni leg's run at the default size: it goes
// on until it has its operations and every Patroni fault has been
// injected and recovered from once (a SIGKILLed node is replaced after
// the leader key's TTL, 20 s, and rejoins some seconds later).
const patroniMaxTime = 5 * time.Minute

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
// postmaster and of the whole node, crashes of the primary's server and
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

// failover is one Patroni fault of a run. Times are from the fault's
// injection, At, on CLOCK_MONOTONIC like the history's.
type failover struct {
	Kind     string
	Old, New string
	At       int64
	// Writable: until the new primary accepted a write (pgtest's poller;
	// Patroni's part). Resumed: until the workers' operations were
	// acknowledged again, at the end of the longest gap between
	// acknowledgements from At to 5 s after Writable (-1: none then).
	// Recovered: until a synchronous standby was back.
	Writable, Resumed, Recovered time.Duration
}

// patroniTarget makes a run's database on p, "chaos_<workload>", with the
// run's tables.
func patroniTarget(t *testing.T, p *pgtest.Patroni, workload string) target {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	pr := &patroniRun{p: p, db: "chaos_" + workload}
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

// take keeps the Patroni faults of kinds for the run's Patroni player and
// returns the others, for the schedule.
func (pr *patroniRun) take(kinds []string) []string {
	var rest []string
	for _, k := range kinds {
		switch {
		case scheduled[k]:
			rest = append(rest, k)
		case !slices.Contains(pr.kinds, pgtest.PatroniFault(k)):
			pr.kinds = append(pr.kinds, pgtest.PatroniFault(k))
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
		if !slices.ContainsFunc(pr.done, func(f failover) bool { return f.Kind == string(k) }) {
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
		done[string(k)]++
		c.t.Logf("Patroni %s %s → %s: writable after %v, synchronous standby after %v",
			k, f.Old, f.New, f.Writable.Round(time.Millisecond), f.Recovered.Round(time.Millisecond))
	}
}

// inject injects k, waits for the cluster to recover, and records it. It
// reports whether k was injected: if not, the cluster is as it was.
func (pr *patroniRun) inject(ctx context.Context, k pgtest.PatroniFault, c *cluster) (failover, bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 4*time.Minute)
	defer cancel()
	pr.busy.Lock()
	defer pr.busy.Unlock()
	if _, err := pr.p.WaitSynchronous(ctx); err != nil { // after a crash, say
		return failover{}, true, err // not injected, but not as it was either
	}
	at := mono()
	fo, err := pr.p.Fault(ctx, k)
	if fo == nil {
		return failover{}, false, err
	}
	f := failover{Kind: string(k), Old: fo.Old, New: fo.New, At: at, Writable: fo.Writable}
	if rerr := fo.Recover(ctx); rerr != nil || err != nil {
		return f, true, fmt.Errorf("fault: %v; recover: %v", err, rerr)
	}
	f.Recovered = time.Duration(mono() - at)
	c.admin.Reset() // sessions on the old primary are gone
	pr.mu.Lock()
	pr.done = append(pr.done, f)
	pr.mu.Unlock()
	return f, true, nil
}

// waitStreaming waits until the primary (admin's) has a synchronous
// standby streaming again after a crash, which ended its replication
// connections: until then Patroni may drop the standby from its sync key
// (a switchover is refused, a failover promotes nobody), and its REST API
// can still answer from the key as it was before the crash.
func (pr *patroniRun) waitStreaming(ctx context.Context, admin *pgxpool.Pool) error {
	for {
		var n int
		err := admin.QueryRow(ctx, "select count(*) from pg_stat_replication where state = 'streaming' and sync_state = 'sync'").Scan(&n)
		if err == nil && n > 0 {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("no synchronous standby streaming after the crash: %v", err)
		}
		pause(ctx, 50*time.Millisecond)
	}
}

// failovers returns the run's failovers with the time the workers took to
// have operations acknowledged again, read from the history evs.
func (pr *patroniRun) failovers(evs []event) []failover {
	var acks []int64
	for _, e := range evs {
		if e.K == evRet && e.Res == resOK {
			acks = append(acks, e.T)
		}
	}
	slices.Sort(acks)
	pr.mu.Lock()
	defer pr.mu.Unlock()
	out := slices.Clone(pr.done) // in the order injected
	for i, f := range out {
		until := f.At + int64(f.Writable+5*time.Second)
		if i+1 < len(out) {
			until = min(until, out[i+1].At)
		}
		out[i].Resumed = resumed(acks, f.At, until)
	}
	return out
}

// resumed returns, from at, the end of the longest gap between the
// acknowledgements acks (sorted) in [at, until], at counting as one: the
// outage the fault caused. -1 if none came after at.
func resumed(acks []int64, at, until int64) time.Duration {
	prev, best, end := at, int64(-1), int64(-1)
	for _, a := range acks[sortedFrom(acks, at):] {
		if a > until {
			break
		}
		if a-prev > best {
			best, end = a-prev, a
		}
		prev = a
	}
	if end < 0 {
		return -1
	}
	return time.Duration(end - at)
}

// sortedFrom is the index of the first of acks (sorted) at or after at.
func sortedFrom(acks []int64, at int64) int {
	i, _ := slices.BinarySearch(acks, at)
	return i
}

func (f failover) String() string {
	res := "never (within 5 s of writable)"
	if f.Resumed >= 0 {
		res = fmt.Sprintf("%v (%+v after writable)", ms(f.Resumed), ms(f.Resumed-f.Writable))
	}
	return fmt.Sprintf("%s %s→%s: writable %v, operations acknowledged again %s, synchronous standby %v",
		f.Kind, f.Old, f.New, ms(f.Writable), res, ms(f.Recovered))
}

func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// failoverSummary gives, per fault kind, p50 and max of the times of fs.
func failoverSummary(fs []failover) string {
	by := map[string][]failover{}
	for _, f := range fs {
		by[f.Kind] = append(by[f.Kind], f)
	}
	var b strings.Builder
	b.WriteString("fault: n, writable p50/max, operations acknowledged again p50/max (after writable p50/max), synchronous standby p50/max\n")
	for _, k := range slices.Sorted(maps.Keys(by)) {
		var w, r, o, s []time.Duration
		never := 0
		for _, f := range by[k] {
			w, s = append(w, f.Writable), append(s, f.Recovered)
			if f.Resumed < 0 {
				never++
				continue
			}
			r, o = append(r, f.Resumed), append(o, f.Resumed-f.Writable)
		}
		fmt.Fprintf(&b, "  %s: %d, %s, %s (%s; never %d), %s\n", k, len(by[k]), p50max(w), p50max(r), p50max(o), never, p50max(s))
	}
	return b.String()
}

// p50max prints the median and the maximum of ds.
func p50max(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	slices.Sort(ds)
	return fmt.Sprintf("%v/%v", ms(ds[(len(ds)-1)/2]), ms(ds[len(ds)-1]))
}
