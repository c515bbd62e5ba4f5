package shard_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestProcChaos is the shard chaos test with real processes: members
// are child processes (the test binary started again), each a Member
// whose owners make fenced writes (Shard.Guard) until their Context ends,
// and one more after, as a stale owner acting late would. Rounds cycle:
// a member SIGKILLed; a new member added; a member SIGSTOPped past its
// trust window (its member row expired on the server), then resumed with
// SIGCONT, to find its leases lost and join again; a member restarted
// (SIGTERM: it leaves; then a new process with its identity). After each
// join or leave the group must settle by the server's view — member rows
// of the live members only, every shard held by one of them, loads within
// one, no change for two polls — and the test records the shards moved
// (by the lease rows before and after) against N/M, and the takeover after
// SIGKILL (by the server's clock, with its breakdown) against the
// documented bound, TTL + PollInterval plus the statements' time. Each
// member's Store has a pool of its own, apart from its owners' writes
// (SHARD_PROC_SHARED_POOL=1: one pool for both, as before). At the end the
// checker proves, from the committed writes alone, that no shard ever had
// two trusted owners (see procCluster.check).
//
// Default: 60 shards, 3 processes, 6 rounds (TTL 2 s, poll 200 ms).
// PGLOCKS_STRESS=1: 1,000 shards, 10 processes, 100 rounds (TTL 10 s,
// poll 1 s), and the statements per second of the group at rest.
// PGLOCKS_PROC_ROUNDS and PGLOCKS_PROC_SEED override the rounds and the
// seed of the victims' choice. Moves are asserted to stay within
// 1.2 × N/M, except in a round where another member lost its member row
// and joined again (its row's token rose), which the package leaves
// outside that bound: such a round is held to 1.2 × (1 + 2k) × N/M for k
// such members, and at most one round in 20 (at least one) may go past 1.2 × N/M that way.
func TestProcChaos(t *testing.T) {
	t.Parallel()
	cfg := procConfig{shards: 60, members: 3, rounds: 6, ttl: 2 * time.Second, poll: 200 * time.Millisecond, settleWithin: time.Minute}
	big := os.Getenv("PGLOCKS_STRESS") != ""
	if big {
		// TTL 10 s, as TestStress: with 5 s, on the loaded 2-core machine,
		// renewals of members starting up (1,000 acquisitions and their
		// first writes at once) missed their trust deadlines and members
		// rejoined.
		cfg = procConfig{shards: 1000, members: 10, rounds: 100, ttl: 10 * time.Second, poll: time.Second, settleWithin: 3 * time.Minute}
	}
	if n, err := strconv.Atoi(os.Getenv("PGLOCKS_PROC_ROUNDS")); err == nil && n > 0 {
		cfg.rounds = n
	}
	// About 100 fenced writes a second in all, whatever the size.
	cfg.every = max(100*time.Millisecond, time.Duration(cfg.shards)*10*time.Millisecond)
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("PGLOCKS_PROC_SEED"), 10, 64); err == nil {
		seed = s
	}
	t.Logf("%d shards, %d processes, %d rounds, TTL %v, poll %v, a write per owner every %v on average; seed %d",
		cfg.shards, cfg.members, cfg.rounds, cfg.ttl, cfg.poll, cfg.every, seed)
	c := newProcCluster(t, cfg)
	r := &procRun{c: c, rng: rand.New(rand.NewPCG(seed, seed))}
	start := time.Now()
	for range cfg.members {
		c.spawn(c.newID())
	}
	r.settled("start")
	t.Logf("%d processes started and settled in %v", cfg.members, time.Since(start).Round(time.Millisecond))
	if big {
		c.restRate()
	}
	for i := range cfg.rounds {
		[]func(int){r.kill, r.add, r.stop, r.restart}[i%4](i)
	}
	r.report()
}

// TestProcCheckerCatchesPlantedBug proves the checker: the members'
// Guard is made to accept every transaction (plant.GuardSkipsCheck), one
// is stopped until the other took its shards, then resumed — its owners'
// writes carry their old tokens — and the checker must report it.
func TestProcCheckerCatchesPlantedBug(t *testing.T) {
	t.Parallel()
	c := newProcCluster(t, procConfig{shards: 20, members: 2, ttl: time.Second, poll: 100 * time.Millisecond,
		every: 100 * time.Millisecond, settleWithin: time.Minute, plant: "guard-skips-check"})
	r := &procRun{c: c, rng: rand.New(rand.NewPCG(1, 1))}
	c.spawn(c.newID())
	c.spawn(c.newID())
	r.settled("start")
	r.stop(0)
	rep := c.check()
	if len(rep.violations) == 0 {
		t.Fatalf("the checker found no violation in a run whose Guard checks nothing: %s", rep)
	}
	t.Logf("the checker reports the planted bug: %s", rep)
}

// procRun runs a procCluster's rounds and keeps their record.
type procRun struct {
	c   *procCluster
	rng *rand.Rand
	own map[string]string // shard → owner at the last settle

	moves   []procMove
	subject string           // the member the round acts on
	rows    map[string]int64 // member row tokens at the last settle
	// rejoined are the members, other than the subject, whose member row
	// was taken again since the settle before the last: they lost it
	// (renewals late on a loaded machine) and joined again, which moves
	// shards outside the bound a join or leave is held to.
	rejoined []string
	spreads  []int           // max − min of the loads at each settle
	kills    []time.Duration // takeover after SIGKILL, by the server clock (see breakdown)
	stops    []time.Duration // takeover after SIGSTOP, stuck shards aside
	leaves   []time.Duration // takeover after SIGTERM
	stuck    int             // shards stuck behind a stopped member's open transaction
	skipped  int             // moves not measured: stop rounds with stuck shards
}

// procMove is the shards moved by one join or leave.
type procMove struct {
	what  string
	join  bool // a join (else a leave)
	moved int
	bigM  int // the larger member count, before or after
	// rejoined are other members that lost their rows and joined again
	// meanwhile: the move is not held to the bound.
	rejoined []string
}

func (m procMove) ratio(n int) float64 { return float64(m.moved) * float64(m.bigM) / float64(n) }

// settled waits for the group to settle, records the spread of the loads
// and returns the ownership, which becomes r.own.
func (r *procRun) settled(what string) map[string]string {
	r.c.t.Helper()
	own, at := r.c.settle(what)
	live := r.c.live()
	load := procView{owner: own}.loads(live)
	r.spreads = append(r.spreads, spread(load))
	r.c.t.Logf("%s: settled after %v, %d members, loads %d..%d", what, at.Round(time.Millisecond), len(live),
		slices.Min(mapValues(load)), slices.Max(mapValues(load)))
	r.own = own
	rows := r.c.view().rows
	r.rejoined = nil
	for _, id := range live {
		if old, ok := r.rows[id]; ok && rows[id] > old && id != r.subject {
			r.rejoined = append(r.rejoined, id)
		}
	}
	r.rows = rows
	return own
}

// move records the shards moved from before to after.
func (r *procRun) move(what string, before, after map[string]string, bigM int) {
	// After a join the group has the larger count, after a leave not.
	m := procMove{what: what, join: len(r.c.live()) == bigM, moved: movedCount(before, after), bigM: bigM,
		rejoined: r.rejoined}
	r.moves = append(r.moves, m)
	r.c.t.Logf("%s: %d shards moved, %.2f × N/M (M = %d)", what, m.moved, m.ratio(r.c.cfg.shards), bigM)
	if len(m.rejoined) > 0 {
		r.c.t.Logf("%s: %v lost their member rows and joined again meanwhile: not held to the bound", what, m.rejoined)
	}
}

// pick returns a live member at random.
func (r *procRun) pick() string {
	live := r.c.live()
	return live[r.rng.IntN(len(live))]
}

// kill SIGKILLs a member: its rows expire and the others take over.
func (r *procRun) kill(i int) {
	m, victim, before := len(r.c.live()), r.pick(), r.own
	r.subject = victim
	t0 := time.Now()
	r.c.signal(victim, syscall.SIGKILL)
	snap := r.c.snapKill(victim, t0)
	seen := r.c.waitTakeover(victim, before, t0)
	what := fmt.Sprintf("round %d: SIGKILL %s", i, victim)
	took := r.c.breakdown(what, snap, victim, before, seen)
	r.kills = append(r.kills, took)
	r.c.t.Logf("%s: its shards taken over after %v by the server's clock, seen by the test after %v (bound TTL + PollInterval = %v)",
		what, took.Round(time.Millisecond), seen.Round(time.Millisecond), r.c.cfg.ttl+r.c.cfg.poll)
	r.move(what, before, r.settled(what), m)
}

// add starts a new member.
func (r *procRun) add(i int) {
	id, before := r.c.newID(), r.own
	r.subject = id
	r.c.spawn(id)
	what := fmt.Sprintf("round %d: join %s", i, id)
	r.move(what, before, r.settled(what), len(r.c.live()))
}

// stop SIGSTOPs a member until its member row has expired on the server
// (past its trust window) and the others hold its shards, then resumes
// it: it finds its leases lost and joins again.
func (r *procRun) stop(i int) {
	m, victim, before := len(r.c.live()), r.pick(), r.own
	r.subject = victim
	p := r.c.member(victim)
	p.paused.Store(true)
	p.stopped.Store(true)
	t0 := time.Now()
	r.c.signal(victim, syscall.SIGSTOP)
	took, stuck := r.c.waitAway(victim, before, t0)
	r.stops = append(r.stops, took)
	what := fmt.Sprintf("round %d: SIGSTOP %s", i, victim)
	r.c.t.Logf("%s: its shards taken over after %v, %d stuck behind its open transactions", what, took.Round(time.Millisecond), len(stuck))
	mid := before
	if len(stuck) == 0 {
		mid = r.settled(what)
		r.move(what, before, mid, m)
	} else {
		r.stuck += len(stuck)
		r.skipped += 2
	}
	p.stopped.Store(false)
	r.c.signal(victim, syscall.SIGCONT)
	what = fmt.Sprintf("round %d: SIGCONT %s", i, victim)
	after := r.settled(what)
	if len(stuck) == 0 {
		r.move(what+" (joins again)", mid, after, m)
	}
	p.paused.Store(false)
}

// restart makes a member leave (SIGTERM) and starts a new process with
// its identity: a rolling deploy's step.
func (r *procRun) restart(i int) {
	m, victim, before := len(r.c.live()), r.pick(), r.own
	r.subject = victim
	t0 := time.Now()
	p := r.c.signal(victim, syscall.SIGTERM)
	took := r.c.waitTakeover(victim, before, t0)
	r.c.waitExit(p)
	r.leaves = append(r.leaves, took)
	what := fmt.Sprintf("round %d: SIGTERM %s", i, victim)
	r.c.t.Logf("%s: its shards taken over after %v", what, took.Round(time.Millisecond))
	mid := r.settled(what)
	r.move(what, before, mid, m)
	r.c.spawn(victim)
	what = fmt.Sprintf("round %d: restart %s", i, victim)
	r.move(what, mid, r.settled(what), m)
}

func mapValues(m map[string]int) []int {
	vs := make([]int, 0, len(m))
	for _, v := range m {
		vs = append(vs, v)
	}
	return vs
}
