package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/dial"
	"github.com/pglocks/pglocks/internal/engine"
	"github.com/pglocks/pglocks/internal/engine/enginetest"
	"github.com/pglocks/pglocks/pgtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pgtest.WrapMain(m))
}

func probe(t *testing.T, db *pgtest.DB) engine.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	first, err := dial.Dedicated(ctx, cfg, dial.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close(ctx)
	start := time.Now()
	r, err := engine.Probe(ctx, cfg, first, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("probe took %v", time.Since(start))
	var n int
	if err := first.QueryRow(ctx, "select count(*) from pg_catalog.pg_locks where locktype = 'advisory'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("the probe left %d advisory locks on the server", n)
	}
	return r
}

// TestProbePostgreSQL: PostgreSQL passes every check.
func TestProbePostgreSQL(t *testing.T) {
	t.Parallel()
	if r := probe(t, pgtest.New(t)); len(r.Failures()) != 0 {
		t.Fatalf("PostgreSQL failed the probe: %v", r.Failures())
	}
}

// TestProbeLiars: a database whose search_path shadows one primitive's
// functions with ones that do nothing fails that primitive's check and no
// other.
func TestProbeLiars(t *testing.T) {
	t.Parallel()
	for _, p := range []engine.Primitive{engine.SessionLocks, engine.XactLocks, engine.Clock} {
		t.Run(string(p), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			enginetest.Lie(t, db, p)
			r := probe(t, db)
			fs := r.Failures()
			if len(fs) != 1 || fs[0].Primitive != p {
				t.Fatalf("failures %v, want %s alone", fs, p)
			}
			t.Logf("%v", fs[0])
		})
	}
}
