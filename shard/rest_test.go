package shard_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestRestCost (PGLOCKS_STRESS=1) measures what a settled group costs the
// server at rest: 1,000 shards over 10 members, TTL 10 s, poll 1 s, the
// owners' writes paused. It logs each statement's calls and server time
// per second over 60 s (pg_stat_statements), then the server time of one
// read of the member rows and of one read of the whole group (members and
// shard leases), 100 of each.
func TestRestCost(t *testing.T) {
	if os.Getenv("PGLOCKS_STRESS") == "" {
		t.Skip("PGLOCKS_STRESS=1 runs it")
	}
	// Not parallel: pg_stat_statements_reset resets every database's
	// counts, TestStress's too; the parallel tests wait for this one.
	g := newGroup(t, 1000, 10*time.Second, time.Second)
	for i := range 10 {
		g.join(fmt.Sprintf("m%d", i))
	}
	g.settle(5 * time.Minute)
	g.quiet.Store(true)
	<-time.After(15 * time.Second) // let the writes in flight end: a measurement, not a synchronization
	ctx := context.Background()
	conn := g.db.Conn(t)
	reset := func() {
		if _, err := conn.Exec(ctx, "select pg_stat_statements_reset()"); err != nil {
			t.Fatal(err)
		}
	}
	reset()
	const window = 60 * time.Second
	start := time.Now()
	<-time.After(window) // a measurement window, not a synchronization
	el := time.Since(start).Seconds()
	rows, _ := conn.Query(ctx, `select s.calls, s.total_exec_time, s.rows, left(regexp_replace(s.query, '\s+', ' ', 'g'), 60)
from pg_stat_statements s join pg_database d on d.oid = s.dbid
where d.datname = current_database() and s.query not like '%pg_stat%' order by total_exec_time desc limit 4`)
	var calls, nrows int64
	var total float64
	var q string
	_, err := pgx.ForEachRow(rows, []any{&calls, &total, &nrows, &q}, func() error {
		t.Logf("at rest: %5.2f calls/s, %5.2f ms/s of server time, %6.1f rows/call: %s", float64(calls)/el, total/el, float64(nrows)/float64(calls), q)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	st := newCalcStore(t, g)
	for _, prefix := range []string{g.name + "#m:", g.name + "#"} {
		reset()
		n := 0
		for range 100 {
			infos, err := st.ListPrefix(ctx, prefix)
			if err != nil {
				t.Fatal(err)
			}
			n = len(infos)
		}
		var mean float64
		if err := conn.QueryRow(ctx, `select mean_exec_time from pg_stat_statements where query like '%starts_with%'`).Scan(&mean); err != nil {
			t.Fatal(err)
		}
		t.Logf("one read of %q: %d rows, %.3f ms of server time", prefix+"*", n, mean)
	}
}
