package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
	permits    map[string]int // semaphore → the most permits trusted at once
	failovers  []failover     // a Patroni leg's
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
	for _, f := range r.failovers {
		fmt.Fprintf(&b, "failover:   %s\n", f)
	}
	fmt.Fprintf(&b, "porcupine:  %s in %v\n", r.linResult, r.checker.Round(time.Millisecond))
	if len(r.permits) > 0 {
		fmt.Fprintf(&b, "permits:    %s (the most trusted at once, limit %d)\n", table(r.permits), semLimit)
	}
	fmt.Fprintf(&b, "violations: %d\n", len(r.violations))
	for _, v := range r.violations {
		fmt.Fprintf(&b, "  - %s\n", v)
	}
	return b.String()
}

// check runs every oracle over the finished run.
func check(c *cluster, rc runConfig) report {
	if d := os.Getenv("CHAOS_DUMP"); d != "" {
		// One directory per run: CHAOS_DUMP/TestName.
		to := filepath.Join(d, strings.ReplaceAll(c.t.Name(), "/", "_"))
		if out, err := exec.Command("sh", "-c", `rm -rf "$2" && mkdir -p "$(dirname "$2")" && cp -r "$1" "$2"`, "sh", c.dir, to).CombinedOutput(); err != nil {
			c.t.Errorf("CHAOS_DUMP: %v: %s", err, out)
		} else {
			c.t.Logf("history saved in %s (CHAOS_CHECK=%s go test -run TestCheckDump ./chaos/)", to, to)
		}
	}
	r := analyse(c.history())
	r.violations = append(r.violations, c.afterRun(rc)...)
	return r
}

// analyse runs the history oracles: linearizability, trust windows (one
// holder per name; at most semLimit permits per semaphore), and the
// guarded counter's bounds (the counter's value is read by afterRun).
func analyse(evs []event) report {
	r := report{ops: map[string]int{}}
	var fenced []porcupine.Operation
	for _, op := range operations(evs) {
		in := op.Input.(linIn)
		r.ops[in.Op+"/"+op.Output.(linOut).Res]++
		if !unmodelled[in.Op] && constrains(in, op.Output.(linOut)) {
			fenced = append(fenced, op)
		}
	}
	start := time.Now()
	v, res := checkLinearizable(fenced, 2*time.Minute)
	r.checker, r.linResult = time.Since(start), string(res)
	if v != "" {
		r.violations = append(r.violations, v)
	}
	ws := trustWindows(evs)
	r.violations = append(r.violations, overlaps(ws)...)
	peaks, over := permitCounts(ws)
	r.permits = peaks
	r.violations = append(r.violations, over...)
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
			(select count(*) from pglocks_leases where owner is not null and owner <> '00000000-0000-0000-0000-000000000000' and expires_at > now()), -- a semaphore's limit row is held by the nil owner
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

// TestCheckDump re-runs the history oracles on a run's histories saved
// with CHAOS_DUMP: CHAOS_CHECK=dir go test -run TestCheckDump ./chaos/.
func TestCheckDump(t *testing.T) {
	dir := os.Getenv("CHAOS_CHECK")
	if dir == "" {
		t.Skip("CHAOS_CHECK=dir names a history saved with CHAOS_DUMP")
	}
	all := historyIn(t, dir)
	r := analyse(all)
	t.Log("\n" + r.String())
	if len(r.violations) > 0 {
		t.Errorf("%d violation(s)", len(r.violations))
	}
}

// TestCheckerReportsCutShortRead checks a history that TestCutShortPlainReads
// recorded (name n1 only, in testdata/cutshort): a plain read returned a
// value whose commit had been cut short, a promotion lost that commit, and
// a later read returned the value before it. The checker must report it.
func TestCheckerReportsCutShortRead(t *testing.T) {
	t.Parallel()
	r := analyse(historyIn(t, filepath.Join("testdata", "cutshort")))
	if len(r.violations) != 1 || !strings.Contains(r.violations[0], "n1: ") ||
		!strings.Contains(r.violations[0], "read(n1 tok=0 val=0) -> ok tok=0 val=2203318222876") {
		t.Fatalf("want one violation on n1 naming the stale read; got:\n%s", r)
	}
}

// historyIn reads the histories saved in dir.
func historyIn(t *testing.T, dir string) []event {
	files, err := filepath.Glob(filepath.Join(dir, "w*.jsonl"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no history in %s (%v)", dir, err)
	}
	var all []event
	for _, f := range files {
		evs, err := readEvents(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, evs...)
	}
	return all
}
