package lease_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(withExamples{pgtest.WrapMain(m, pgtest.WithTemplate(func(ctx context.Context, conn *pgx.Conn) error {
		ddl, err := lease.SchemaSQL(lease.Config{})
		if err != nil {
			return err
		}
		_, err = conn.Exec(ctx, ddl)
		return err
	}))})
}

// withExamples closes the examples' server after the tests ran.
type withExamples struct{ m interface{ Run() int } }

func (w withExamples) Run() int {
	defer closeExamples()
	return w.m.Run()
}

// bundle is what most tests need: a fresh database with the default lease
// table, a pool on it and a store over the pool.
type bundle struct {
	db    *pgtest.DB
	pool  *pgxpool.Pool
	store *lease.Store
}

func setup(t *testing.T) bundle {
	t.Helper()
	db := pgtest.New(t)
	pool := poolFor(t, db)
	return bundle{db: db, pool: pool, store: newStore(t, pool, lease.Config{})}
}

// newStore makes a store closed when the test ends (before its pool).
func newStore(t testing.TB, pool *pgxpool.Pool, cfg lease.Config) *lease.Store {
	t.Helper()
	s, err := lease.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	return s
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// exec runs sql on the pool, failing the test on error.
func exec(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	// QueryExecModeExec: the pool may be behind a transaction-mode pooler.
	if _, err := pool.Exec(context.Background(), sql, append([]any{pgx.QueryExecModeExec}, args...)...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// expire ends the lease name in the past by the server clock, as if its
// TTL had run out, without waiting for it.
func expire(t testing.TB, pool *pgxpool.Pool, name string) {
	t.Helper()
	exec(t, pool, "update pglocks_leases set expires_at = now() - interval '1 second' where name = $1", name)
}

func mustTry(t testing.TB, s *lease.Store, name string, ttl time.Duration, opts ...lease.Option) *lease.Lease {
	t.Helper()
	l, err := s.TryAcquire(ctxT(t), name, ttl, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// waitFor waits for ch to be closed, or fails the test after d.
func waitFor(t testing.TB, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s did not happen within %v", what, d)
	}
}

// recorder is a pgx tracer that keeps the acquire statements it saw.
type recorder struct {
	mu    sync.Mutex
	all   []traced
	taken int // all[:taken] were returned by take
}

// traced is one statement a recorder saw.
type traced struct {
	sql  string
	args []any
}

func (r *recorder) install(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = r }

func (r *recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if isAcquire(data.SQL) {
		r.mu.Lock()
		r.all = append(r.all, traced{data.SQL, data.Args})
		r.mu.Unlock()
	}
	return ctx
}

// isAcquire reports whether sql is one of the store's acquire statements
// (the full one, the retake or the fast retake).
func isAcquire(sql string) bool { return strings.Contains(sql, "upd as (") || isFastAcquire(sql) }

// isFastAcquire reports whether sql is the fast retake of a released row.
func isFastAcquire(sql string) bool {
	return !strings.Contains(sql, "upd as (") && strings.Contains(sql, "attempt = $7::uuid")
}

func (r *recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// last returns the last acquire statement seen, "" if none.
func (r *recorder) last() (string, []any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.all) == 0 {
		return "", nil
	}
	t := r.all[len(r.all)-1]
	return t.sql, t.args
}

// take returns the acquire statements seen since the last take.
func (r *recorder) take() []traced {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.all[r.taken:]
	r.taken = len(r.all)
	return t
}

// waitParked waits until an Acquire of s is blocked waiting.
func waitParked(t testing.TB, s *lease.Store) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for lease.Parked(s) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no Acquire is waiting")
		}
		runtime.Gosched()
	}
}
