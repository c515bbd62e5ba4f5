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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	c, err := dial.Dedicated(ctx, cfg, dial.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	m, err := pooler.Probe(ctx, cfg, c)
	if err != nil {
		t.Fatal(err)
	}
	return m
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
