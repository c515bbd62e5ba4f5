package advisory_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pgtest.WrapMain(m))
}

// bundle is what most tests need: a fresh database, a pool on it and a
// locker on the pool, closed at cleanup.
type bundle struct {
	db     *pgtest.DB
	pool   *pgxpool.Pool
	locker *advisory.Locker
	app    string
}

func setup(t testing.TB, cfgs ...advisory.Config) *bundle {
	t.Helper()
	db := pgtest.New(t)
	pool := poolFor(t, db)
	var cfg advisory.Config
	if len(cfgs) > 0 {
		cfg = cfgs[0]
	}
	if cfg.ApplicationName == "" {
		cfg.ApplicationName = "pglocks-test-" + db.Name
	}
	l := newLocker(t, pool, cfg)
	return &bundle{db: db, pool: pool, locker: l, app: cfg.ApplicationName}
}

func newLocker(t testing.TB, pool *pgxpool.Pool, cfg advisory.Config) *advisory.Locker {
	t.Helper()
	l, err := advisory.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			t.Errorf("close locker: %v", err)
		}
	})
	return l
}

// ctxT returns a context bounded by a generous deadline.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it is true or the deadline passes.
func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	delay := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		timer := time.NewTimer(delay)
		<-timer.C
		delay = min(2*delay, 50*time.Millisecond)
	}
}
