package advisory_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// pooledPath makes the network path of a holder: through a session-mode
// PgBouncer when pooled (then the proxy sits between the holder and
// PgBouncer, whose link to the server stays healthy), else straight to the
// server. The proxy is partitionable. It returns the direct bundle (its
// locker and pool reach the server directly), the proxy and the holder's
// pool.
func pooledPath(t *testing.T, pooled bool) (*bundle, *pgtest.Proxy, *pgxpool.Pool) {
	t.Helper()
	b := setup(t)
	target, dsn := "", b.db.DSN
	if pooled {
		bouncer, bdsn := b.db.Bouncer(t, pgtest.PoolSession)
		target, dsn = bouncer.Addr(), bdsn
	} else {
		addr, err := b.db.Server.Addr()
		if err != nil {
			t.Fatal(err)
		}
		target = addr
	}
	p := pgtest.NewProxy(t, target, pgtest.Partitionable())
	pdsn, err := pgtest.ViaProxy(dsn, p)
	if err != nil {
		t.Fatal(err)
	}
	return b, p, lazyPool(t, pdsn)
}

// TestPartitionedHolderFreed: a holder cut off from the network for
// real — behind a session-mode PgBouncer, cut between the holder and
// PgBouncer while PgBouncer's link to the server stays healthy — has its
// lock freed by the server in bounded time (no holder in pg_locks, another
// client's TryLock succeeds), and announces the loss before the server
// frees it. PgBouncer keeps the server session as long as it keeps its dead
// client (its own TCP keepalive: hours), so the server's TCP settings
// cannot do it there: the lock session ends itself once its pings stop
// (idle_session_timeout). The direct path is measured alongside, with the
// same default Config. Both times are bounded: the loss is announced
// within PingInterval + QueryTimeout and the lock freed within
// TCPUserTimeout, each plus slack for a loaded 2-core machine.
func TestPartitionedHolderFreed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		pooled bool
	}{{"Direct", false}, {"SessionBouncer", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			partitionedHolderFreed(t, tc.pooled)
		})
	}
}

func partitionedHolderFreed(t *testing.T, pooled bool) {
	b, p, pool := pooledPath(t, pooled)
	defer p.Pass()
	l := newLocker(t, pool, advisory.Config{ApplicationName: b.app + "-holder"})
	cfg := l.Config()
	ctx := ctxT(t)
	key := pglocks.KeyOf("pooled-partition")
	lk, err := l.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Partition(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var lostAt atomic.Int64 // since start; 0 until Lost is closed
	go func() {
		select {
		case <-lk.Lost():
			lostAt.Store(int64(max(time.Since(start), 1)))
		case <-ctx.Done():
		}
	}()
	// The server must free it within TCPUserTimeout (the idle bound; the
	// keepalive bound is shorter) plus slack for a loaded machine; before
	// the fix it never did behind PgBouncer.
	const slack = 5 * time.Second
	bound := cfg.TCPUserTimeout + slack
	var lastHeld time.Duration // start of the latest check that saw it held
	waitFor(t, "the server to free the partitioned holder's lock", bound, func() bool {
		at := time.Since(start)
		held, err := advisory.IsHeld(ctx, b.pool, key)
		if err != nil {
			t.Fatal(err)
		}
		if held {
			lastHeld = at
		}
		return !held
	})
	freed := time.Since(start)
	lost := time.Duration(lostAt.Load())
	t.Logf("pooled=%v: holder announced the loss %v after the cut; the server still held the lock at %v and had freed it by %v (TCPUserTimeout %v, keepalive bound %v)",
		pooled, lost.Round(time.Millisecond), lastHeld.Round(time.Millisecond), freed.Round(time.Millisecond),
		cfg.TCPUserTimeout, cfg.KeepalivesIdle+cfg.KeepalivesInterval*time.Duration(cfg.KeepalivesCount))
	if lost == 0 || lost >= lastHeld {
		t.Errorf("the holder announced the loss at %v, not before the server freed the lock (still held at %v): %v",
			lost, lastHeld, lk.Err())
	}
	if detect := cfg.PingInterval + cfg.QueryTimeout; lost > detect+slack {
		t.Errorf("the holder announced the loss %v after the cut: later than PingInterval + QueryTimeout (%v) + %v", lost, detect, slack)
	}
	if !errors.Is(lk.Err(), advisory.ErrLost) {
		t.Errorf("holder's Err = %v, want ErrLost", lk.Err())
	}
	other, err := b.locker.TryLock(ctx, key)
	if err != nil {
		t.Fatalf("another client's TryLock after the server freed the lock: %v", err)
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestHealthyIdleHolderKept: a holder that stays idle well past the
// server's idle bound for lock sessions (idle_session_timeout =
// TCPUserTimeout) keeps its lock, directly and behind a session-mode
// PgBouncer: its pings keep the session busy. So do the Locker's session
// that holds nothing (kept alive by a rarer ping) and its LISTEN connection
// (which has no idle bound).
func TestHealthyIdleHolderKept(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		pooled bool
	}{{"Direct", false}, {"SessionBouncer", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			healthyIdleHolderKept(t, tc.pooled)
		})
	}
}

func healthyIdleHolderKept(t *testing.T, pooled bool) {
	b, _, pool := pooledPath(t, pooled)
	cfg := advisory.Config{
		ApplicationName:    b.app + "-idle",
		MaxSessions:        1,
		PingInterval:       100 * time.Millisecond,
		QueryTimeout:       time.Second,
		KeepalivesIdle:     time.Second,
		KeepalivesInterval: time.Second,
		KeepalivesCount:    2,
		TCPUserTimeout:     1500 * time.Millisecond,
	}
	l := newLocker(t, pool, cfg)
	ctx := ctxT(t)
	held, err := l.Lock(ctx, pglocks.KeyOf("idle-held"))
	if err != nil {
		t.Fatal(err)
	}
	// A Locker whose only session holds nothing: taken and given back.
	spareCfg := cfg
	spareCfg.ApplicationName += "-spare"
	spareL := newLocker(t, pool, spareCfg)
	spare, err := spareL.Lock(ctx, pglocks.KeyOf("idle-spare"))
	if err != nil {
		t.Fatal(err)
	}
	sparePID := spare.PID()
	if err := spare.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	listener := listenerPID(t, ctx, b, cfg.ApplicationName, held.PID())
	const idleFor = 4 * 1500 * time.Millisecond
	select {
	case <-held.Lost():
		t.Fatalf("the idle holder lost its lock: %v", held.Err())
	case <-time.After(idleFor):
	}
	if ok, err := advisory.IsHeld(ctx, b.pool, held.Key()); err != nil || !ok {
		t.Fatalf("after %v idle the server holds the lock: %v, %v", idleFor, ok, err)
	}
	again, err := spareL.TryLock(ctx, pglocks.KeyOf("idle-spare"))
	if err != nil {
		t.Fatalf("TryLock on the idle Locker after %v: %v", idleFor, err)
	}
	if again.PID() != sparePID {
		t.Errorf("after %v idle a new session (pid %d) replaced the one holding nothing (pid %d)", idleFor, again.PID(), sparePID)
	}
	if now := listenerPID(t, ctx, b, cfg.ApplicationName, held.PID()); now != listener {
		t.Errorf("after %v idle the LISTEN connection's backend is %d, was %d", idleFor, now, listener)
	}
	for _, lk := range []*advisory.Lock{again, held} {
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// listenerPID waits for the LISTEN connection of a Locker with one
// session, session (the other backend of app), to listen, and returns its
// pid.
func listenerPID(t *testing.T, ctx context.Context, b *bundle, app string, session uint32) int32 {
	t.Helper()
	var pid int32
	waitFor(t, "the LISTEN connection", 10*time.Second, func() bool {
		err := b.pool.QueryRow(ctx, `select pid from pg_stat_activity
			where application_name = $1 and pid <> $2 and (query ilike 'listen %' or query = '-- ping')`,
			app, int32(session)).Scan(&pid)
		return err == nil
	})
	return pid
}
