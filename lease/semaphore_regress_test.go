package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// TestSemaphoreRegressSetLimitRace: a grant that read the old limit and
// is still in flight when SetLimit lowers the limit, and a grant that
// reads the new limit, never leave more permits held than the new limit.
// SetLimit waits for the grant in flight (which holds the limit row FOR
// KEY SHARE), so a later try sees its permit.
func TestSemaphoreRegressSetLimitRace(t *testing.T) {
	b := setup(t)
	ctx := ctxT(t)
	hsem, _ := b.store.Semaphore("r", 4)
	h, err := hsem.TryAcquire(ctx, 2, time.Minute) // slots 0, 1
	if err != nil {
		t.Fatal(err)
	}
	// An uncommitted insert of r#2 makes X's INSERT of r#2 wait, after X
	// read limit 4 and the counts.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `insert into pglocks_leases (name, token, ttl, acquired_at, renewed_at, expires_at)
		values ('r#2', 1, '0', now(), now(), now())`); err != nil {
		t.Fatal(err)
	}
	lockWaits := func() int {
		var n int
		_ = b.pool.QueryRow(ctx, `select count(*) from pg_stat_activity where wait_event_type = 'Lock' and datname = current_database()`).Scan(&n)
		return n
	}
	xsem, _ := newStore(t, b.pool, lease.Config{}).Semaphore("r", 4)
	xc := make(chan error, 1)
	go func() {
		_, err := xsem.TryAcquire(ctx, 1, time.Minute)
		xc <- err
	}()
	eventually(t, 30*time.Second, "X waiting on the insert", func() bool { return lockWaits() == 1 })
	if err := h.Leases()[0].Release(ctx); err != nil { // slot 0 free
		t.Fatal(err)
	}
	setc := make(chan error, 1)
	go func() { setc <- hsem.SetLimit(ctx, 2) }()
	var setErr error
	set := false
	eventually(t, 30*time.Second, "SetLimit returned or waiting", func() bool {
		select {
		case setErr = <-setc:
			set = true
			return true
		default:
			return lockWaits() == 2
		}
	})
	ysem, _ := newStore(t, b.pool, lease.Config{}).Semaphore("r", 2)
	var y *lease.Permits
	var yerr error
	if set { // SetLimit did not wait for X: Y tries while X is in flight
		y, yerr = ysem.TryAcquire(ctx, 1, time.Minute)
		_ = tx.Rollback(ctx)
	} else {
		_ = tx.Rollback(ctx)
		setErr = <-setc
		y, yerr = ysem.TryAcquire(ctx, 1, time.Minute)
	}
	if setErr != nil {
		t.Fatal(setErr)
	}
	xerr := <-xc
	n, err := hsem.Count(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("SetLimit waited for X: %v; X: %v; Y: %v; count %d (limit 2)", !set, xerr, yerr, n)
	if n > 2 {
		t.Errorf("%d permits held after SetLimit(2) returned: Y was granted while X's permit was in flight", n)
	}
	if y != nil {
		_ = y.Release(ctx)
	}
}

// TestSemaphoreRegressOverLimitRace: while a permit above a lowered limit
// is held, two racing grants that cannot see each other's permit do not
// both pass: grants then serialize on the limit row.
func TestSemaphoreRegressOverLimitRace(t *testing.T) {
	b := setup(t)
	ctx := ctxT(t)
	sem, _ := b.store.Semaphore("o", 5)
	all, err := sem.TryAcquire(ctx, 5, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ls := all.Leases()
	for _, i := range []int{0, 2, 3} { // slots 1 and 4 stay held
		if err := ls[i].Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := sem.SetLimit(ctx, 3); err != nil {
		t.Fatal(err)
	}
	// held 2 + 1 <= 3: room for one more permit, not two. X inserts o#0
	// (o#2 is locked, so it skips it) and waits on an uncommitted insert
	// of o#0; then o#2 is unlocked and Y tries.
	if _, err := b.pool.Exec(ctx, `delete from pglocks_leases where name = 'o#0'`); err != nil {
		t.Fatal(err)
	}
	ins, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ins.Rollback(ctx)
	if _, err := ins.Exec(ctx, `insert into pglocks_leases (name, token, ttl, acquired_at, renewed_at, expires_at)
		values ('o#0', 1, '0', now(), now(), now())`); err != nil {
		t.Fatal(err)
	}
	lk, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Rollback(ctx)
	if _, err := lk.Exec(ctx, `select from pglocks_leases where name = 'o#2' for update`); err != nil {
		t.Fatal(err)
	}
	xsem, _ := newStore(t, b.pool, lease.Config{}).Semaphore("o", 3)
	xc := make(chan error, 1)
	go func() {
		_, err := xsem.TryAcquire(ctx, 1, time.Minute)
		xc <- err
	}()
	eventually(t, 30*time.Second, "X waiting on the insert", func() bool {
		var n int
		_ = b.pool.QueryRow(ctx, `select count(*) from pg_stat_activity where wait_event_type = 'Lock' and datname = current_database()`).Scan(&n)
		return n == 1
	})
	_ = lk.Rollback(ctx)
	ysem, _ := newStore(t, b.pool, lease.Config{}).Semaphore("o", 3)
	_, yerr := ysem.TryAcquire(ctx, 1, time.Minute)
	_ = ins.Rollback(ctx)
	xerr := <-xc
	n, err := sem.Count(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("X: %v; Y: %v; count %d (limit 3)", xerr, yerr, n)
	if n > 3 {
		t.Errorf("%d permits held with limit 3", n)
	}
}

// TestSemaphoreRegressUnknownAboveLocalLimit: a semaphore made with limit
// 1 whose stored limit is 3 takes slot 1 and the reply is lost; the
// cleanup by attempt id covers every slot, not only those below the
// local limit.
func TestSemaphoreRegressUnknownAboveLocalLimit(t *testing.T) {
	b := setup(t)
	ctx := ctxT(t)
	s, p := viaProxy(t, b)
	sem, _ := s.Semaphore("up", 1)
	w, err := sem.TryAcquire(ctx, 1, time.Minute) // prepares the statement
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	bsem, _ := b.store.Semaphore("up", 3)
	if err := bsem.SetLimit(ctx, 3); err != nil {
		t.Fatal(err)
	}
	hold, err := bsem.TryAcquire(ctx, 1, time.Minute) // slot 0
	if err != nil {
		t.Fatal(err)
	}
	p.DropReplies()
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = sem.TryAcquire(rctx, 1, 2*time.Minute)
	cancel()
	t.Logf("TryAcquire with its reply lost: %v", err)
	p.Pass()
	eventually(t, 30*time.Second, "only slot 0 held", func() bool {
		n, err := bsem.Count(ctx)
		return err == nil && n == 1
	})
	_ = hold.Release(ctx)
}

// TestSemaphoreRegressAcquireWithinCtx: Semaphore.Acquire holding the
// turn returns within its ctx when the network is down: the turn's
// release goes on in the background.
func TestSemaphoreRegressAcquireWithinCtx(t *testing.T) {
	b := setup(t)
	ctx := ctxT(t)
	s, p := viaProxy(t, b)
	bsem, _ := b.store.Semaphore("ov", 1)
	hold, err := bsem.TryAcquire(ctx, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	sem, _ := s.Semaphore("ov", 1)
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	done := make(chan time.Time, 1)
	go func() {
		_, err := sem.Acquire(wctx, 1, time.Minute)
		t.Logf("Acquire: %v", err)
		done <- time.Now()
	}()
	eventually(t, 30*time.Second, "the waiter's turn", func() bool {
		held, err := b.store.IsHeld(ctx, "ov#turn")
		return err == nil && held
	})
	p.Blackhole()
	dl, _ := wctx.Deadline()
	end := <-done
	t.Logf("Acquire returned %v after its ctx's deadline", end.Sub(dl))
	if end.Sub(dl) > time.Second {
		t.Errorf("Acquire returned %v after its ctx ended", end.Sub(dl))
	}
	p.Pass()
	_ = hold.Release(ctx)
}

// TestSemaphoreRegressLostRaceNotFull: a free slot row locked by another
// transaction is a lost race, retried, and reported (after a few) as
// free slots locked, not as a full semaphore; once the lock is gone the
// try passes.
func TestSemaphoreRegressLostRaceNotFull(t *testing.T) {
	b := setup(t)
	ctx := ctxT(t)
	sem, _ := b.store.Semaphore("lr", 1)
	pm, err := sem.TryAcquire(ctx, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_ = pm.Release(ctx)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `select 1 from pglocks_leases where name = 'lr#0' for update`); err != nil {
		t.Fatal(err)
	}
	_, err = sem.TryAcquire(ctx, 1, time.Minute)
	var full *lease.FullError
	if !errors.As(err, &full) || !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("TryAcquire over a locked free slot: %v, want a FullError with Locked", err)
	}
	if full.Locked != 1 || full.Held != 0 {
		t.Errorf("FullError %v: Locked %d Held %d, want 1 and 0 (a lost race, not a full semaphore)", full, full.Locked, full.Held)
	}
	_ = tx.Rollback(ctx)
	pm, err = sem.TryAcquire(ctx, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_ = pm.Release(ctx)
}

// TestAcquireAllRegressGuardedExpired: TryAcquireAll over an expired lease
// whose row a Guard's transaction still locks reports the name as locked
// (errors.Is ErrHeld) after a few tries instead of 100, and AcquireAll
// waits with backoff and takes the set once the transaction ends.
func TestAcquireAllRegressGuardedExpired(t *testing.T) {
	b := setup(t)
	ctx := ctxT(t)
	l := mustTry(t, b.store, "g", 2*time.Second)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := l.Guard(ctx, tx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "g expired", func() bool {
		held, err := b.store.IsHeld(ctx, "g")
		return err == nil && !held
	})
	s := newStore(t, b.pool, lease.Config{})
	start := time.Now()
	_, err = s.TryAcquireAll(ctx, []string{"g", "h"}, time.Minute)
	took := time.Since(start)
	var all *lease.HeldAllError
	if !errors.As(err, &all) || len(all.Held) != 1 || !all.Held[0].Locked || all.Held[0].Name != "g" {
		t.Fatalf("TryAcquireAll after %v: %v, want a HeldAllError naming g as locked", took, err)
	}
	t.Logf("TryAcquireAll after %v: %v", took, err)
	if took > 2*time.Second {
		t.Errorf("TryAcquireAll took %v over a locked row", took)
	}
	got := make(chan error, 1)
	go func() {
		ls, err := s.AcquireAll(ctx, []string{"g", "h"}, time.Minute)
		for _, l := range ls {
			_ = l.Release(ctx)
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("AcquireAll returned while the row was locked: %v", err)
	case <-time.After(300 * time.Millisecond): // a check that it waits, not a synchronization
	}
	_ = tx.Rollback(ctx)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// TestSemaphoreRegressLimitRowNotALease: the limit row of a semaphore
// looks held to lease acquisitions, so they cannot overwrite the limit.
func TestSemaphoreRegressLimitRowNotALease(t *testing.T) {
	b := setup(t)
	ctx := ctxT(t)
	sem, _ := b.store.Semaphore("x", 3)
	pm, err := sem.TryAcquire(ctx, 1, time.Minute) // stores the limit
	if err != nil {
		t.Fatal(err)
	}
	_ = pm.Release(ctx)
	if _, err := b.store.TryAcquireAll(ctx, []string{"x#limit"}, time.Minute); !errors.Is(err, lease.ErrHeld) {
		t.Errorf("TryAcquireAll(x#limit): %v, want ErrHeld", err)
	}
	if _, err := b.store.TryAcquire(ctx, "x#limit", time.Minute); !errors.Is(err, lease.ErrHeld) {
		t.Errorf("TryAcquire(x#limit): %v, want ErrHeld", err)
	}
	if err := sem.SetLimit(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.TryAcquire(ctx, "x#limit", time.Minute); !errors.Is(err, lease.ErrHeld) {
		t.Errorf("TryAcquire(x#limit) after SetLimit: %v, want ErrHeld", err)
	}
	if lim, err := sem.Limit(ctx); err != nil || lim != 2 {
		t.Errorf("Limit: %d %v, want 2", lim, err)
	}
}

// TestSemaphoreRegressInput: bad input to semaphores is refused with an
// error naming it.
func TestSemaphoreRegressInput(t *testing.T) {
	b := setup(t)
	ctx := ctxT(t)
	var nilCtx context.Context
	sem, err := b.store.Semaphore("a#b", 256)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sem.TryAcquire(nilCtx, 1, time.Minute); err == nil {
		t.Error("TryAcquire(nil ctx) passed")
	}
	if err := sem.SetLimit(nilCtx, 2); err == nil {
		t.Error("SetLimit(nil ctx) passed")
	}
	if err := sem.SetLimit(ctx, 257); !errors.Is(err, lease.ErrInvalidPermits) {
		t.Errorf("SetLimit(257): %v", err)
	}
	if _, err := sem.Acquire(ctx, 257, time.Minute); !errors.Is(err, lease.ErrInvalidPermits) {
		t.Errorf("Acquire(257): %v", err)
	}
	var p *lease.Permits
	if err := p.Release(ctx); err == nil {
		t.Error("nil Permits Release passed")
	}
	var z lease.Semaphore
	if _, err := z.TryAcquire(ctx, 1, time.Minute); err == nil {
		t.Error("zero Semaphore TryAcquire passed")
	}
	pm, err := sem.TryAcquire(ctx, 256, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := pm.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
