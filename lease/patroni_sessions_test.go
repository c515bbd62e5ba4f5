package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

// runApp is the application_name of a run's sessions (its pool's, and
// its stores' listeners, which connect as the pool does).
const runApp = "pglocks-patroni-run"

// noSessionsLeft fails t if, 30 s after a run ended, the primary still
// has sessions of the run's (runApp): a store or pool the run left open
// would reconnect to every new primary, and some twenty runs' would fill
// its max_connections.
func noSessionsLeft(t *testing.T, p *pgtest.Patroni, run string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, err := p.WaitPrimary(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	dsn, err := p.NodeDSN(primary)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		err := conn.QueryRow(ctx, "select count(*) from pg_stat_activity where application_name = $1", runApp).Scan(&n)
		if err == nil && n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s ended 30 s ago and left %d sessions on the primary %s (%v)", run, n, primary, err)
		}
		select { // polls the server; the sessions end on their own
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}
