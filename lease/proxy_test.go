package lease_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// proxied returns a store whose pool reaches the test database through a
// fault-injecting proxy, and the proxy. Each configure function may change
// the pool's config first.
func proxied(t *testing.T, b bundle, configure ...func(*pgxpool.Config)) (*lease.Store, *pgtest.Proxy) {
	t.Helper()
	p, dsn := b.db.Proxy(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	t.Cleanup(p.Pass) // before the pool closes
	return newStore(t, pool, lease.Config{}), p
}

// TestKeepAliveShortBlackhole: a network stall shorter than the trust
// window delays renewals but loses nothing.
func TestKeepAliveShortBlackhole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	s, p := proxied(t, b)
	// Renewed every second, trusted for 2.7 s after each: a 500 ms fault
	// leaves renewals time to get through, even on a loaded machine.
	l := mustTry(t, s, "bh", 3*time.Second, lease.WithKeepAlive())
	p.Blackhole()
	select {
	case <-time.After(500 * time.Millisecond):
	case <-l.Lost():
		t.Fatalf("lost during a short blackhole: %v", l.Err())
	}
	p.Pass()
	exp := l.ExpiresAt()
	eventually(t, 5*time.Second, "a renewal after the blackhole", func() bool { return l.ExpiresAt().After(exp) })
	if err := l.Err(); err != nil {
		t.Fatalf("lost: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestKeepAliveLongBlackhole: when renewals cannot get through, the holder
// declares the lease lost before another client can have acquired it — the
// loss comes before that client even sends its successful try.
func TestKeepAliveLongBlackhole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	s, p := proxied(t, b)
	sends := &sendTimes{}
	other := newStore(t, b.db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = sends }), lease.Config{})

	l := mustTry(t, s, "bh", time.Second, lease.WithKeepAlive())
	lostAtc := make(chan time.Time, 1)
	go func() {
		<-l.Lost()
		lostAtc <- time.Now()
	}()
	p.Blackhole()
	next, err := other.Acquire(ctx, "bh", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	sent := sends.last()
	var lostAt time.Time
	select {
	case lostAt = <-lostAtc:
	case <-time.After(time.Second):
		t.Fatal("another client acquired the lease and the holder still trusts it")
	}
	if !lostAt.Before(sent) {
		t.Fatalf("holder declared the loss %v after the winning try was sent", lostAt.Sub(sent))
	}
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return l.Guard(ctx, tx) }); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Guard of the lost lease: %v, want ErrNotHeld", err)
	}
	t.Logf("holder declared the loss %v before the other client sent its winning try", sent.Sub(lostAt))
	if !errors.Is(l.Err(), lease.ErrLost) {
		t.Fatalf("Err = %v", l.Err())
	}
	if next.Token() != l.Token()+1 {
		t.Fatalf("token %d after %d", next.Token(), l.Token())
	}
	p.Pass()
	if err := l.Release(ctx); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("release by the old holder: %v, want ErrNotHeld", err)
	}
}

// sendTimes is a pgx tracer recording when each acquire statement was sent.
type sendTimes struct {
	mu sync.Mutex
	at time.Time
}

func (s *sendTimes) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if isAcquire(data.SQL) {
		s.mu.Lock()
		s.at = time.Now()
		s.mu.Unlock()
	}
	return ctx
}

func (s *sendTimes) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *sendTimes) last() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.at
}
