package lease_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// sqlCounter is a pgx tracer that counts the statements sent (all) and
// those that match (n).
type sqlCounter struct {
	match  func(sql string) bool
	all, n atomic.Int64
}

func (c *sqlCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.all.Add(1)
	if c.match(data.SQL) {
		c.n.Add(1)
	}
	return ctx
}

func (c *sqlCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// isRenewal reports whether sql renews leases (one or a batch).
func isRenewal(sql string) bool { return strings.Contains(sql, "set renewed_at") }

// TestKeepAliveBatched: a store renews its kept-alive leases
// together, in one statement per round, not one per lease: 300 leases of
// TTL 3 s (renewed every second) for three seconds cost a few statements,
// not 900, and every lease stays held.
func TestKeepAliveBatched(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	c := &sqlCounter{match: isRenewal}
	pool := db.NewPool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = c })
	s := newStore(t, pool, lease.Config{})
	ctx := ctxT(t)
	const n = 300
	ls := make([]*lease.Lease, n)
	for i := range ls {
		ls[i] = mustTry(t, s, "batch"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+string(rune('a'+i/26)), 3*time.Second, lease.WithKeepAlive())
	}
	before := c.n.Load()
	renewals, exp := 0, ls[0].ExpiresAt()
	eventually(t, 30*time.Second, "three renewals of the first lease", func() bool {
		if e := ls[0].ExpiresAt(); e.After(exp) {
			renewals, exp = renewals+1, e
		}
		return renewals >= 3
	})
	stmts := c.n.Load() - before
	for _, l := range ls {
		if err := l.Err(); err != nil {
			t.Fatalf("%s: %v", l.Name(), err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d kept-alive leases, three renewal rounds: %d renewal statements", n, stmts)
	if stmts >= n/10 {
		t.Fatalf("%d renewal statements for %d leases over three rounds: not batched", stmts, n)
	}
}

// TestGuardHoldsBackOnlyItsLease: a guarded transaction holds back the
// renewals of the lease it guards, and of no other: the batch skips the
// locked row. The guarded lease (TTL 1 s) is lost under a Guard held
// longer than its trust window, as the package doc says; the other lives
// on.
func TestGuardHoldsBackOnlyItsLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	guarded := mustTry(t, b.store, "guarded", time.Second, lease.WithKeepAlive())
	other := mustTry(t, b.store, "other", time.Second, lease.WithKeepAlive())
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := guarded.Guard(ctx, tx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, guarded.Lost(), 10*time.Second, "the guarded lease's loss")
	exp := other.ExpiresAt()
	eventually(t, 10*time.Second, "a renewal of the other lease", func() bool { return other.ExpiresAt().After(exp) })
	if err := other.Err(); err != nil {
		t.Fatalf("other lease: %v", err)
	}
	_ = tx.Rollback(ctx)
}
