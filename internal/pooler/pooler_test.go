package pooler_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/dial"
	"github.com/pglocks/pglocks/internal/pooler"
	"github.com/pglocks/pglocks/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func probe(t *testing.T, dsn string) pooler.Mode {
	t.Helper()
	m, err := probeErr(t, dsn, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// probeErr dials a connection on dsn and probes it within d.
func probeErr(t *testing.T, dsn string, d time.Duration) (pooler.Mode, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	c, err := dial.Dedicated(ctx, cfg, dial.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	return pooler.Probe(ctx, cfg, c)
}

// TestProbe: the probe names what really stands between client and server:
// nothing, a session-mode PgBouncer, a transaction-mode PgBouncer.
func TestProbe(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	if m := probe(t, db.DSN); m != pooler.Direct {
		t.Errorf("direct: probe says %v", m)
	}
	for _, c := range []struct {
		mode pgtest.PoolMode
		want pooler.Mode
	}{{pgtest.PoolSession, pooler.Session}, {pgtest.PoolTransaction, pooler.Transaction}} {
		_, dsn := db.Bouncer(t, c.mode)
		for range 3 { // not by luck
			if m := probe(t, dsn); m != c.want {
				t.Errorf("PgBouncer %s mode: probe says %v, want %v", c.mode, m, c.want)
			}
		}
	}
}

// TestProbeUnderTraffic: other clients' statements through the same
// pooler, taking and freeing server sessions all the while, do not make
// the probe mistake one mode for the other.
func TestProbeUnderTraffic(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, c := range []struct {
		mode pgtest.PoolMode
		want pooler.Mode
	}{{pgtest.PoolSession, pooler.Session}, {pgtest.PoolTransaction, pooler.Transaction}} {
		_, dsn := db.Bouncer(t, c.mode)
		ctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for range 4 {
			conn, err := pgx.Connect(ctx, dsn+"&default_query_exec_mode=simple_protocol")
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				defer conn.Close(context.Background())
				for ctx.Err() == nil {
					_, _ = conn.Exec(ctx, "select pg_backend_pid()")
				}
			})
		}
		for range 10 {
			if m := probe(t, dsn); m != c.want {
				t.Errorf("PgBouncer %s mode under traffic: probe says %v, want %v", c.mode, m, c.want)
			}
		}
		stop()
		wg.Wait()
	}
}

// TestProbeRoundRobin: a transaction-mode
// PgBouncer that hands out its idle server sessions in turn
// (server_round_robin = 1) with two of them. The first connection's
// statement and the second's transaction alternated between the two in
// lockstep, so the first always found its own session and the second
// never landed on it: the probe said Session.
func TestProbeRoundRobin(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, dsn := db.Bouncer(t, pgtest.PoolTransaction, pgtest.BouncerPoolSize(2), pgtest.BouncerRoundRobin())
	warm(t, dsn, 2)
	for i := range 5 {
		if m := probe(t, dsn); m != pooler.Transaction {
			t.Fatalf("probe %d: says %v behind a round-robin transaction-mode PgBouncer with 2 server sessions", i, m)
		}
	}
}

// warm makes a pooler open n server sessions at once (n clients each in
// a statement that sleeps, which any pooling mode allows), so that it
// keeps n idle ones afterwards.
func warm(t *testing.T, dsn string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, n)
	for range n {
		go func() {
			c, err := pgx.Connect(ctx, dsn+"&default_query_exec_mode=simple_protocol")
			if err == nil {
				_, err = c.Exec(ctx, "select pg_sleep(0.2)")
				_ = c.Close(ctx)
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
