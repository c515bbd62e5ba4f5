package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// report is a run's summary.
type report struct {
	seed       uint64
	ops        map[string]int // "op/result" → count
	faults     map[string]int
	checker    time.Duration
	linResult  string
	violations []string
}

func (r report) String() string {
	var b strings.Builder
	total := 0
	for _, n := range r.ops {
		total += n
	}
	fmt.Fprintf(&b, "operations: %d  (%s)\n", total, table(r.ops))
	fmt.Fprintf(&b, "faults:     %s\n", table(r.faults))
	fmt.Fprintf(&b, "porcupine:  %s in %v\n", r.linResult, r.checker.Round(time.Millisecond))
	fmt.Fprintf(&b, "violations: %d\n", len(r.violations))
	for _, v := range r.violations {
		fmt.Fprintf(&b, "  - %s\n", v)
	}
	return b.String()
}

// check runs every oracle over the finished run.
func check(c *cluster, rc runConfig) report {
	if d := os.Getenv("CHAOS_DUMP"); d != "" {
		_ = exec.Command("cp", "-r", c.dir, d).Run()
	}
	r := analyse(c.history())
	r.violations = append(r.violations, c.afterRun(rc)...)
	return r
}

// analyse runs the history oracles: linearizability, trust windows, and
// the guarded counter's bounds (the counter's value is read by afterRun).
func analyse(evs []event) report {
	r := report{ops: map[string]int{}}
	var fenced []porcupine.Operation
	for _, op := range operations(evs) {
		in := op.Input.(linIn)
		r.ops[in.Op+"/"+op.Output.(linOut).Res]++
		if in.Op != opLock && in.Op != opUnlock {
			fenced = append(fenced, op)
		}
	}
	start := time.Now()
	v, res := checkLinearizable(fenced, 2*time.Minute)
	r.checker, r.linResult = time.Since(start), string(res)
	if v != "" {
		r.violations = append(r.violations, v)
	}
	r.violations = append(r.violations, overlaps(trustWindows(evs))...)
	for _, e := range evs {
		if e.K == evLeak {
			r.violations = append(r.violations, fmt.Sprintf("worker %d: %s", e.P, e.Text))
		}
	}
	return r
}

// counterBounds returns, per name, the guarded writes that were
// acknowledged and those whose outcome is unknown.
func counterBounds(evs []event) (acked, unknown map[string]int64) {
	acked, unknown = map[string]int64{}, map[string]int64{}
	for _, op := range operations(evs) {
		in, out := op.Input.(linIn), op.Output.(linOut)
		if in.Op != opWrite {
			continue
		}
		switch out.Res {
		case resOK:
			acked[in.Name]++
		case resUnknown:
			unknown[in.Name]++
		}
	}
	return acked, unknown
}

// afterRun checks the server once the workers are gone: the counter
// within its bounds, no row held once the longest TTL has passed, no
// worker session left.
func (c *cluster) afterRun(rc runConfig) []string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var v []string
	acked, unknown := counterBounds(c.history())
	rows, err := c.admin.Query(ctx, "select name, n from protected order by name")
	if err != nil {
		return []string{"read counters: " + err.Error()}
	}
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			return []string{err.Error()}
		}
		if n < acked[name] || n > acked[name]+unknown[name] {
			v = append(v, fmt.Sprintf("counter %s = %d, want %d acknowledged (+ up to %d unknown)", name, n, acked[name], unknown[name]))
		}
	}
	const longestTTL = 2500 * time.Millisecond
	deadline := time.Now().Add(longestTTL + 5*time.Second)
	for {
		var held, locks, sessions int
		err := c.admin.QueryRow(ctx, `select
			(select count(*) from pglocks_leases where owner is not null and expires_at > now()),
			(select count(*) from pg_locks where locktype = 'advisory'
				and database = (select oid from pg_database where datname = current_database())),
			(select count(*) from pg_stat_activity where datname = current_database() and application_name <> $1)`,
			adminApp).Scan(&held, &locks, &sessions)
		if err != nil {
			return append(v, "after the run: "+err.Error())
		}
		if held == 0 && locks == 0 && sessions == 0 {
			return v
		}
		if time.Now().After(deadline) {
			return append(v, fmt.Sprintf("after the run: %d leases held, %d advisory locks held, %d worker sessions left", held, locks, sessions))
		}
		pause(ctx, 100*time.Millisecond)
	}
}
