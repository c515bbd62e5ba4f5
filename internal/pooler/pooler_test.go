package pooler_test

import (
	"context"
	"testing"
	"time"

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
