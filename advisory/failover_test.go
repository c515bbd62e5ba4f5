package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// TestFailover fails the primary over to its standby while one Locker
// holds locks and another waits for them, both on a pool whose multi-host
// DSN has target_session_attrs=read-write. Advisory locks are not
// replicated, so: every held lock's Lost fires; the waiting Locks go on
// and acquire on the new primary; the holder's Locker reconnects there and
// finds the keys held by the waiter.
func TestFailover(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t)
	db := c.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	holder := newLocker(t, db.NewPool(t), advisory.Config{ApplicationName: "failover-holder"})
	waiter := newLocker(t, db.NewPool(t), advisory.Config{ApplicationName: "failover-waiter"})

	const n = 5
	var held []*advisory.Lock
	for i := range n {
		lk, err := holder.Lock(ctx, pglocks.KeyOf(fmt.Sprint("failover-", i)))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, lk)
	}
	type result struct {
		lk  *advisory.Lock
		err error
		at  time.Time
	}
	got := make(chan result, n)
	for _, lk := range held {
		go func() {
			w, err := waiter.Lock(ctx, lk.Key())
			got <- result{w, err, time.Now()}
		}()
	}
	// The waiter's session exists once its Lock has tried.
	old := connect(t, c.PrimaryDSN(db.Name))
	waitFor(t, "the waiter's first try", time.Minute, func() bool {
		var k int
		err := old.QueryRow(ctx, "select count(*) from pg_stat_activity where application_name = 'failover-waiter'").Scan(&k)
		return err == nil && k > 0
	})

	lost := make(chan time.Time, n)
	for _, lk := range held {
		go func() {
			select {
			case <-lk.Lost():
				lost <- time.Now()
			case <-ctx.Done():
				lost <- time.Time{}
			}
		}()
	}
	stop := time.Now()
	took, err := c.Promote(ctx)
	if err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	var lastLost time.Duration
	for i := range n {
		at := <-lost
		if at.IsZero() {
			t.Fatalf("Lost did not fire on lock %d after the failover", i)
		}
		lastLost = max(lastLost, at.Sub(stop))
	}
	t.Logf("every held lock's Lost fired within %v of the stop: %v", lastLost.Round(time.Millisecond), held[0].Err())
	newPrimary := connect(t, c.PrimaryDSN(db.Name))
	var slowest time.Duration
	for range n {
		r := <-got
		if r.err != nil {
			t.Fatalf("a waiting Lock failed across the failover: %v", r.err)
		}
		slowest = max(slowest, r.at.Sub(promoted))
		if !heldBy(t, ctx, newPrimary, r.lk.PID()) {
			t.Fatalf("lock on %v not held by backend %d of the new primary", r.lk.Key(), r.lk.PID())
		}
	}
	t.Logf("promotion took %v; every waiting Lock acquired within %v after it", took.Round(time.Millisecond), slowest.Round(time.Millisecond))
	// The holder's Locker reconnects to the new primary (a Lock waits
	// through the dial failures of the failover, a TryLock would report
	// the last one), where the waiter now holds the keys.
	lk, err := holder.Lock(ctx, pglocks.KeyOf("failover-new"))
	if err != nil {
		t.Fatalf("the holder's Locker did not reconnect: %v", err)
	}
	if !heldBy(t, ctx, newPrimary, lk.PID()) {
		t.Fatalf("the holder's new lock is not held by backend %d of the new primary", lk.PID())
	}
	if _, err := holder.TryLock(ctx, held[0].Key()); !errors.Is(err, advisory.ErrLocked) {
		t.Fatalf("holder TryLock on a key the waiter holds: %v, want ErrLocked", err)
	}
}

// heldBy reports whether backend pid holds an advisory lock on conn's server.
func heldBy(t *testing.T, ctx context.Context, conn *pgx.Conn, pid uint32) bool {
	t.Helper()
	var k int
	if err := conn.QueryRow(ctx, "select count(*) from pg_locks where locktype = 'advisory' and granted and pid = $1",
		int32(pid)).Scan(&k); err != nil {
		t.Fatal(err)
	}
	return k > 0
}

// connect opens one connection to dsn, closed when the test ends.
func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// TestStandbyRefused: a Locker pointed at a standby by mistake — where
// advisory locks work, but exclude only that standby's own clients — must
// refuse at once with an error naming the problem, from TryLock and Lock.
func TestStandbyRefused(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t)
	db := c.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l := newLocker(t, lazyPool(t, c.StandbyDSN(db.Name)), advisory.Config{})
	start := time.Now()
	_, err := l.TryLock(ctx, pglocks.KeyOf("standby"))
	if !errors.Is(err, advisory.ErrStandby) {
		t.Fatalf("TryLock on a standby: %v, want ErrStandby", err)
	}
	t.Logf("TryLock: %v after %v", err, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	if _, err := l.Lock(ctx, pglocks.KeyOf("standby")); !errors.Is(err, advisory.ErrStandby) {
		t.Fatalf("Lock on a standby: %v, want ErrStandby at once", err)
	}
	t.Logf("Lock refused after %v", time.Since(start).Round(time.Millisecond))
}
