package shard_test

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"syscall"
	"time"
)

// report runs the checker and logs and asserts the run's figures: no
// violation, no unexpected error, takeovers after SIGKILL within
// TTL + PollInterval plus the time of the others' statements (a read of
// the member rows, one of the whole group, the acquisitions: up to 4.4 s
// beyond the poll measured at load 30–60; 5 s allowed), and every join or
// leave moving at most
// 1.2 × N/M shards. Balance was asserted at every settle.
func (r *procRun) report() {
	t, c := r.c.t, r.c
	rep := c.check()
	t.Logf("checker: %s", rep)
	if n := len(rep.violations) + rep.more; n > 0 {
		t.Errorf("%d violations of 'never two trusted owners'", n)
	}
	if rep.writes == 0 {
		t.Error("no fenced write committed")
	}
	c.mu.Lock()
	counts, samples := maps.Clone(c.counts), maps.Clone(c.samples)
	c.mu.Unlock()
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		t.Logf("%s: %d", k, counts[k])
		if s, ok := samples[k]; ok {
			t.Logf("    first: %s", s)
		}
	}
	for _, e := range c.unexpected() {
		t.Errorf("unexpected: %s", e)
	}
	r.reportMoves()
	r.reportTakeovers()
	hist := map[int]int{}
	for _, s := range r.spreads {
		hist[s]++
	}
	t.Logf("balance: max − min of the loads at the %d settles: %v (value: settles)", len(r.spreads), hist)
}

// reportMoves logs the median and worst moves per join or leave against
// N/M, and asserts the bound.
func (r *procRun) reportMoves() {
	t, n := r.c.t, r.c.cfg.shards
	t.Logf("moves: %d of stop rounds with stuck shards not measured", r.skipped)
	for _, kind := range []string{"join or leave", "join", "leave"} {
		ms := slices.DeleteFunc(slices.Clone(r.moves), func(m procMove) bool {
			return kind != "join or leave" && m.join != (kind == "join")
		})
		if len(ms) == 0 {
			continue
		}
		slices.SortFunc(ms, func(a, b procMove) int { return cmp.Compare(a.ratio(n), b.ratio(n)) })
		worst := ms[len(ms)-1]
		t.Logf("moves per %s: n=%d median %.2f × N/M, worst %.2f × N/M (%s: %d of %d shards, M = %d)",
			kind, len(ms), ms[len(ms)/2].ratio(n), worst.ratio(n), worst.what, worst.moved, n, worst.bigM)
	}
	// A member that lost its row gives up its share and takes a share
	// again: each such member may move up to 2 × N/M more. Such rounds are
	// held to that, and those that needed it must stay rare (a row lost is
	// a renewal missed).
	excused := 0
	for _, m := range r.moves {
		bound := 1.2 * float64(1+2*len(m.rejoined))
		if len(m.rejoined) > 0 && m.ratio(n) > 1.2 {
			excused++ // only the rejoins let it past 1.2 × N/M
		}
		if m.ratio(n) > bound {
			t.Errorf("%s: %d shards moved, %.2f × N/M, more than %.1f × N/M (%d members rejoined meanwhile)", m.what, m.moved, m.ratio(n), bound, len(m.rejoined))
		}
	}
	rejoins := 0
	for _, m := range r.moves {
		if len(m.rejoined) > 0 {
			rejoins++
		}
	}
	t.Logf("moves: %d of %d with another member's row lost and taken again meanwhile, %d of them beyond 1.2 × N/M (held to 1.2 × (1 + 2 × those members) × N/M)", rejoins, len(r.moves), excused)
	if limit := max(1, len(r.moves)/20); excused > limit {
		t.Errorf("%d of %d moves went beyond 1.2 × N/M because members lost their rows meanwhile, more than %d: renewals are missed", excused, len(r.moves), limit)
	}
}

// reportTakeovers logs the takeover times and asserts those after
// SIGKILL, by the server's clock (see procCluster.breakdown): within
// TTL + PollInterval plus the time the survivors' statements take, which
// the run allows 5 s; the members' Stores have pools of their own, which
// the owners' writes cannot keep busy.
func (r *procRun) reportTakeovers() {
	t, cfg := r.c.t, r.c.cfg
	bound := cfg.ttl + cfg.poll
	const statements = 5 * time.Second
	over := 0
	for _, d := range r.kills {
		if d > bound {
			over++
		}
		if d > bound+statements {
			t.Errorf("a takeover after SIGKILL took %v, beyond TTL + PollInterval = %v + %v for the statements", d, bound, statements)
		}
	}
	t.Logf("takeover after SIGKILL (by the server's clock): %s; TTL + PollInterval = %v, exceeded by %d (by the time of the statements)", durations(r.kills), bound, over)
	t.Logf("takeover after SIGSTOP (until its member row expired and its shards were others', stuck ones aside): %s; %d shards stuck behind open transactions in all",
		durations(r.stops), r.stuck)
	t.Logf("takeover after SIGTERM (the member leaves): %s", durations(r.leaves))
}

// durations summarizes ds: count, median and worst.
func durations(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Sorted(slices.Values(ds))
	return fmt.Sprintf("n=%d median %v worst %v", len(s), s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}

// restRate logs the transactions per second the database runs while the
// group is at rest — the members' writes paused (SIGUSR1), and 15 s more
// for the writes in flight to end and the pools to go idle — over 30 s
// (xact_commit + xact_rollback), and the statements of the window by
// calls when pg_stat_statements is there (PGLOCKS_STRESS loads it).
func (c *procCluster) restRate() {
	t := c.t
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	xacts := func() int64 {
		var n int64
		if _, err := c.admin.Exec(ctx, "select pg_stat_clear_snapshot()"); err != nil {
			t.Fatal(err)
		}
		if err := c.admin.QueryRow(ctx, "select xact_commit + xact_rollback from pg_stat_database where datname = current_database()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	c.signalAll(syscall.SIGUSR1)
	defer c.signalAll(syscall.SIGUSR2)
	<-time.After(15 * time.Second) // let the writes in flight end: a measurement, not a synchronization
	var pss bool
	if err := c.admin.QueryRow(ctx, "select exists (select from pg_extension where extname = 'pg_stat_statements')").Scan(&pss); err != nil {
		t.Fatal(err)
	}
	if pss {
		if _, err := c.admin.Exec(ctx, "select pg_stat_statements_reset()"); err != nil {
			t.Fatal(err)
		}
	}
	const window = 30 * time.Second
	a, start := xacts(), time.Now()
	<-time.After(window) // a measurement window, not a synchronization
	b, el := xacts(), time.Since(start).Seconds()
	t.Logf("at rest: %d shards, %d member processes: %.2f transactions/s (%d in %.0f s)", c.cfg.shards, len(c.live()), float64(b-a)/el, b-a, el)
	if pss {
		c.restStatements(ctx, el)
	}
}

// restStatements logs the statements pg_stat_statements counted in this
// database since its reset, by calls, over el seconds.
func (c *procCluster) restStatements(ctx context.Context, el float64) {
	t := c.t
	rows, err := c.admin.Query(ctx, `select s.calls, left(regexp_replace(s.query, '\s+', ' ', 'g'), 100)
from pg_stat_statements s join pg_database d on d.oid = s.dbid
where d.datname = current_database() and s.query not like '%pg_stat%' order by calls desc`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var total int64
	for i := 0; rows.Next(); i++ {
		var n int64
		var q string
		if err := rows.Scan(&n, &q); err != nil {
			t.Fatal(err)
		}
		total += n
		if i < 12 {
			t.Logf("at rest: %6.2f/s  %s", float64(n)/el, q)
		}
	}
	t.Logf("at rest: %.2f statements/s in all (pg_stat_statements)", float64(total)/el)
}
