package pgtest_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

// patroniOptIn skips t unless PGLOCKS_PATRONI=1: a Patroni cluster takes
// some 20 s to start and a failover a TTL (20 s) more.
func patroniOptIn(t *testing.T) {
	t.Helper()
	if os.Getenv("PGLOCKS_PATRONI") != "1" {
		t.Skip("Patroni tests are opt-in: set PGLOCKS_PATRONI=1")
	}
}

// TestPatroniSwitchover: a cluster starts, the multi-host DSN and HAProxy
// both reach the primary, and after patronictl switchover both reach the
// new one, which has a synchronous standby.
func TestPatroniSwitchover(t *testing.T) {
	patroniOptIn(t)
	p := pgtest.NewPatroni(t, pgtest.PatroniOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	old := p.Primary(ctx)
	for _, dsn := range []string{p.DSN(), p.HAProxyDSN()} {
		checkPrimary(ctx, t, dsn)
	}
	if err := p.Switchover(ctx, ""); err != nil {
		t.Fatal(err)
	}
	now, err := p.WaitPrimary(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("switchover %s → %s", old, now)
	for _, dsn := range []string{p.DSN(), p.HAProxyDSN()} {
		checkPrimary(ctx, t, dsn)
	}
}

func checkPrimary(ctx context.Context, t *testing.T, dsn string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		conn, err := pgx.Connect(ctx, dsn)
		var standby bool
		if err == nil {
			err = conn.QueryRow(ctx, "select pg_is_in_recovery()").Scan(&standby)
			_ = conn.Close(ctx)
		}
		if err == nil && !standby {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s reaches no primary: %v (standby %v)", dsn, err, standby)
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
