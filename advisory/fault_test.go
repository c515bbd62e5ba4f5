package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// proxied returns a locker whose connections go through a proxy, and a
// locker on the direct pool.
func proxied(t *testing.T, cfg advisory.Config, opts ...pgtest.ProxyOption) (*bundle, *pgtest.Proxy, *advisory.Locker) {
	t.Helper()
	b := setup(t)
	p, dsn := b.db.Proxy(t, opts...)
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if cfg.ApplicationName == "" {
		cfg.ApplicationName = b.app + "-proxied"
	}
	return b, p, newLocker(t, pool, cfg)
}

func TestProxyReset(t *testing.T) {
	t.Parallel()
	b, p, l := proxied(t, advisory.Config{})
	ctx := ctxT(t)
	key := pglocks.KeyOf("reset")
	lk, err := l.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		w, err := b.locker.Lock(ctx, key)
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- time.Now()
		_ = w.Unlock(ctx)
	}()
	start := time.Now()
	if n := p.Reset(); n == 0 {
		t.Fatal("the proxy had no connection to reset")
	}
	took := waitLost(t, lk, start, 5*time.Second)
	t.Logf("loss announced %v after the connection reset", took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("loss announced after %v, want ≤ 1s", took)
	}
	at, ok := <-got
	if !ok {
		t.FailNow()
	}
	t.Logf("a waiter on the direct pool held the lock %v after the reset", at.Sub(start).Round(time.Millisecond))
	if at.Sub(start) > time.Second {
		t.Errorf("takeover after %v, want ≤ 1s", at.Sub(start))
	}
}

func TestBlackhole(t *testing.T) {
	t.Parallel()
	cfg := advisory.Config{PingInterval: 100 * time.Millisecond, QueryTimeout: 500 * time.Millisecond}
	_, p, l := proxied(t, cfg)
	ctx := ctxT(t)
	lk, err := l.Lock(ctx, pglocks.KeyOf("blackhole"))
	if err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	start := time.Now()
	t.Run("LockHonoursContext", func(t *testing.T) {
		// The session holding lk is busy (pinging into the hole) or will be:
		// a Lock must still return at its deadline, not at QueryTimeout.
		wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		s := time.Now()
		_, err := l.Lock(wctx, pglocks.KeyOf("blackhole-other"))
		if err == nil {
			t.Fatal("Lock succeeded through a blackhole")
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock through a blackhole = %v, want DeadlineExceeded", err)
		}
		t.Logf("Lock with a 50ms deadline returned after %v", time.Since(s).Round(time.Millisecond))
	})
	t.Run("TryLockIsNotErrLocked", func(t *testing.T) {
		// A hung network is a transport failure, never "busy".
		wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := l.TryLock(wctx, pglocks.KeyOf("blackhole-try"))
		if err == nil || errors.Is(err, advisory.ErrLocked) {
			t.Fatalf("TryLock through a blackhole = %v, want a non-ErrLocked error", err)
		}
	})
	bound := cfg.PingInterval*2 + cfg.QueryTimeout
	took := waitLost(t, lk, start, 5*time.Second)
	t.Logf("loss announced %v into the blackhole (bound %v)", took.Round(time.Millisecond), bound)
	if took > bound+500*time.Millisecond {
		t.Errorf("loss announced after %v, want about %v", took, bound)
	}
	p.Pass()
	// New sessions work once the network does.
	waitFor(t, "a lock after the blackhole", 10*time.Second, func() bool {
		lk, err := l.TryLock(ctx, pglocks.KeyOf("blackhole"))
		return err == nil && lk.Unlock(ctx) == nil
	})
}

// With a real partition the server must drop the holder's session, and so
// free its lock, within the keepalive bound, and only after the holder
// announced the loss.
func TestPartitionHygiene(t *testing.T) {
	t.Parallel()
	cfg := advisory.Config{
		PingInterval:       100 * time.Millisecond,
		QueryTimeout:       time.Second,
		KeepalivesIdle:     2 * time.Second,
		KeepalivesInterval: time.Second,
		KeepalivesCount:    2,
		TCPUserTimeout:     3 * time.Second,
	}
	bound := cfg.KeepalivesIdle + cfg.KeepalivesInterval*time.Duration(cfg.KeepalivesCount)
	lost, freed, diag := partitionOnce(t, cfg)
	if diag != "" {
		t.Fatal(diag)
	}
	t.Logf("partition: holder announced the loss after %v; the server freed the lock after %v (keepalive bound %v, tcp_user_timeout %v)",
		lost.Round(time.Millisecond), freed.Round(time.Millisecond), bound, cfg.TCPUserTimeout)
	if freed > bound+2*time.Second {
		t.Errorf("server freed the lock after %v, want within about %v", freed, bound)
	}
	if lost >= freed {
		t.Errorf("holder announced the loss (%v) after the server freed the lock (%v)", lost, freed)
	}
}

// partitionOnce holds a lock through a partitionable proxy, partitions it,
// and measures when the holder announces the loss and when the server frees
// the lock. diag is set when the server did not free it within 30s.
func partitionOnce(t *testing.T, cfg advisory.Config) (lost, freed time.Duration, diag string) {
	b, p, l := proxied(t, cfg, pgtest.Partitionable())
	defer p.Pass()
	ctx := ctxT(t)
	key := pglocks.KeyOf("partition")
	lk, err := l.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	observer := b.db.Conn(t)
	if err := p.Partition(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	lost = waitLost(t, lk, start, 10*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var ok bool
		err := observer.QueryRow(ctx, "select pg_try_advisory_lock($1)", key.Int64()).Scan(&ok)
		freed = time.Since(start)
		if err == nil && ok {
			return lost, freed, ""
		}
		if time.Now().After(deadline) {
			rows, _ := observer.Query(ctx, `select pid, state, coalesce(wait_event, ''), host(client_addr), client_port, backend_start
				from pg_stat_activity where application_name = $1`, l.Config().ApplicationName)
			vals, _ := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
			ss, _ := exec.Command("ss", "-tnoie", "state", "all").CombinedOutput()
			var mine []string
			for _, line := range strings.Split(string(ss), "\n") {
				if strings.Contains(line, "10.251.") {
					mine = append(mine, line)
				}
			}
			return lost, freed, fmt.Sprintf("the server did not free the partitioned lock in 30s (err %v); sessions: %v\nsockets:\n%s",
				err, vals, strings.Join(mine, "\n"))
		}
		<-time.After(20 * time.Millisecond)
	}
}

// A Lock whose ctx ends while its statement is on the wire returns at once;
// the session reads the answer later and gives back the lock it took,
// without closing the session, so other locks on it are not disturbed.
func TestAbandonedStatementKeepsSession(t *testing.T) {
	t.Parallel()
	b, p, l := proxied(t, advisory.Config{MaxSessions: 1})
	ctx := ctxT(t)
	a, err := l.Lock(ctx, pglocks.KeyOf("keep-a"))
	if err != nil {
		t.Fatal(err)
	}
	const latency = 200 * time.Millisecond
	p.SetLatency(latency)
	for _, shared := range []bool{false, true} {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		start := time.Now()
		if shared {
			_, err = l.RLock(wctx, pglocks.KeyOf("keep-b"))
		} else {
			_, err = l.Lock(wctx, pglocks.KeyOf("keep-b"))
		}
		took := time.Since(start)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock with a 20ms deadline over a %v link = %v, want DeadlineExceeded", latency, err)
		}
		if took > latency {
			t.Errorf("Lock with a 20ms deadline returned after %v, not at its deadline", took)
		}
	}
	// The tries reach the server, take keep-b, and are undone.
	waitFor(t, "the abandoned locks to be given back", 10*time.Second, func() bool {
		held, err := advisory.IsHeld(ctx, b.pool, pglocks.KeyOf("keep-b"))
		return err == nil && !held
	})
	p.SetLatency(0)
	select {
	case <-a.Lost():
		t.Fatalf("the session was closed: %v", a.Err())
	default:
	}
	if held, err := advisory.IsHeld(ctx, b.pool, pglocks.KeyOf("keep-a")); err != nil || !held {
		t.Fatalf("keep-a held = %v, %v; want true", held, err)
	}
	// The undo's answer, still on the slow link, frees the key in this
	// process too.
	var lk *advisory.Lock
	waitFor(t, "keep-b to be free in this process", 10*time.Second, func() bool {
		lk, err = l.TryLock(ctx, pglocks.KeyOf("keep-b"))
		if err != nil && !errors.Is(err, advisory.ErrLocked) {
			t.Fatal(err)
		}
		return err == nil
	})
	if lk.PID() != a.PID() {
		t.Errorf("a new session (pid %d) replaced the first (pid %d)", lk.PID(), a.PID())
	}
	for _, x := range []*advisory.Lock{lk, a} {
		if err := x.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
