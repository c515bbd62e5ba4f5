package advisory_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// connectTo opens a connection on dsn, closed when the test ends.
func connectTo(t *testing.T, ctx context.Context, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// TestSessionLockPoolFull: behind a session-mode pooler whose only server
// session the caller's connection has, the pooler check's second
// connection gets no server session. SessionLock must not wait for it as
// long as the caller's ctx (goose passes one never cancelled): it fails
// within the check's own bound, saying why, and holds nothing.
func TestSessionLockPoolFull(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, dsn := db.Bouncer(t, pgtest.PoolSession, pgtest.BouncerPoolSize(1))
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second) // a caller's long ctx
	defer cancel()
	conn := connectTo(t, ctx, dsn)
	began := time.Now()
	err := advisory.SessionLock(ctx, conn, pglocks.KeyOf("pool-full"))
	took := time.Since(began)
	if err == nil || took > 30*time.Second || !strings.Contains(err.Error(), "is the pool full") {
		t.Fatalf("SessionLock behind a full session pool: %v after %v; want a bounded failure saying the pool is full", err, took.Round(time.Millisecond))
	}
	t.Logf("SessionLock behind a full session pool: failed after %v: %v", took.Round(time.Millisecond), err)
	var n int
	if err := conn.QueryRow(ctx, "select count(*) from pg_locks where locktype = 'advisory' and pid = pg_backend_pid()").Scan(&n); err != nil || n != 0 {
		t.Fatalf("after the failed check: %d advisory locks held, %v", n, err)
	}
}

// TestSessionLockProbeCost: behind a session-mode pooler the first
// SessionLock on a connection probes the pooler (a second connection);
// later ones on the same connection reuse the verdict.
func TestSessionLockProbeCost(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, dsn := db.Bouncer(t, pgtest.PoolSession)
	ctx := ctxT(t)
	conn := connectTo(t, ctx, dsn)
	key := pglocks.KeyOf("probe-cost")
	var took []time.Duration
	for range 5 {
		began := time.Now()
		if err := advisory.TrySessionLock(ctx, conn, key); err != nil {
			t.Fatal(err)
		}
		took = append(took, time.Since(began))
		if err := advisory.SessionUnlock(ctx, conn, key); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("TrySessionLock behind a session pooler: first %v (with the probe), then %v", took[0].Round(10*time.Microsecond), took[1:])
}
