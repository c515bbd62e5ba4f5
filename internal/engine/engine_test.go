package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// probe runs the probe on db (the second connection configured by
// configure, if given) and checks that it left no lock behind.
func probe(t *testing.T, db *pgtest.DB, configure ...func(*pgxpool.Config)) engine.Report {
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
	for _, f := range configure {
		f(cfg)
	}
	start := time.Now()
	r := engine.Probe(ctx, cfg, first, true)
	t.Logf("probe took %v", time.Since(start))
	var n int
	if err := first.QueryRow(ctx, "select count(*) from pg_catalog.pg_locks l join pg_catalog.pg_database d on d.oid = l.database where l.locktype = 'advisory' and d.datname = pg_catalog.current_database()").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("the probe left %d advisory locks on the server", n)
	}
	return r
}

func decided(t *testing.T, r engine.Report) {
	t.Helper()
	for _, f := range []engine.Finding{r.SessionLocks, r.XactLocks, r.Clock} {
		if !f.Decided() {
			t.Fatalf("no verdict: %v", f.Err)
		}
	}
}

// TestProbePostgreSQL: PostgreSQL passes every check.
func TestProbePostgreSQL(t *testing.T) {
	t.Parallel()
	r := probe(t, pgtest.New(t))
	decided(t, r)
	if len(r.Failures()) != 0 {
		t.Fatalf("PostgreSQL failed the probe: %v", r.Failures())
	}
}

// TestProbeLiars: a database whose own (pg_catalog) functions of one
// primitive lie fails that primitive's check and no other.
func TestProbeLiars(t *testing.T) {
	t.Parallel()
	for _, p := range []engine.Primitive{engine.SessionLocks, engine.XactLocks, engine.Clock} {
		t.Run(string(p), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			enginetest.Lie(t, db, p)
			r := probe(t, db)
			decided(t, r)
			fs := r.Failures()
			if len(fs) != 1 || fs[0].Primitive != p {
				t.Fatalf("failures %v, want %s alone", fs, p)
			}
			t.Logf("%v", fs[0])
		})
	}
}

// TestProbeLiarForms: one lying form of the session functions alone —
// shared only, the int4 pair only — fails the session check: the probe
// runs every form the Locker sends.
func TestProbeLiarForms(t *testing.T) {
	t.Parallel()
	for _, form := range []enginetest.Form{enginetest.ExclusiveInt64, enginetest.SharedInt64, enginetest.ExclusivePair, enginetest.SharedPair} {
		t.Run(string(form), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			enginetest.LieForms(t, db, form)
			r := probe(t, db)
			decided(t, r)
			fs := r.Failures()
			if len(fs) != 1 || fs[0].Primitive != engine.SessionLocks {
				t.Fatalf("failures %v, want session locks alone", fs)
			}
			t.Logf("%v", fs[0])
		})
	}
}

// TestProbeImmuneToShadows: liars in a schema before pg_catalog, and
// float8 overloads in public, change nothing: the probe (like the Locker)
// calls pg_catalog's functions with typed parameters, and passes.
func TestProbeImmuneToShadows(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	enginetest.Shadow(t, db, enginetest.ExclusiveInt64, enginetest.SharedInt64, enginetest.ExclusivePair, enginetest.SharedPair, enginetest.Xact)
	conn := db.Conn(t)
	for _, s := range []string{
		"create function public.pg_try_advisory_lock(float8) returns boolean language sql as 'select true'",
		"create function public.pg_try_advisory_lock_shared(float8) returns boolean language sql as 'select true'",
		"create function public.pg_advisory_unlock(float8) returns boolean language sql as 'select true'",
	} {
		if _, err := conn.Exec(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	r := probe(t, db)
	decided(t, r)
	if fs := r.Failures(); len(fs) != 0 {
		t.Fatalf("failures %v, want none", fs)
	}
}

// TestProbeMisrouted: a second connection that reaches another database,
// or the same backend, gives no verdict on the locks (an error, no
// Failure); the clock is still checked.
func TestProbeMisrouted(t *testing.T) {
	t.Parallel()
	db, other := pgtest.New(t), pgtest.New(t)
	r := probe(t, db, func(c *pgxpool.Config) {
		c.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
			cc.Database = other.Name
			return nil
		}
	})
	if len(r.Failures()) != 0 || r.SessionLocks.Err == nil || r.XactLocks.Err == nil || !r.Clock.Decided() {
		t.Fatalf("report %+v: want session and transaction locks undecided, no failure, the clock decided", r)
	}
	t.Logf("session locks: %v", r.SessionLocks.Err)
}
