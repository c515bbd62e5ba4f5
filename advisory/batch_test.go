package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// serverHeld returns the advisory locks that backend pid holds, as
// "classid/objid/objsubid/mode".
func serverHeld(t *testing.T, pool *pgxpool.Pool, pid uint32) map[string]bool {
	t.Helper()
	rows, err := pool.Query(ctxT(t), `select classid, objid, objsubid, mode from pg_locks
		where locktype = 'advisory' and granted and pid = $1`, int32(pid))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	held := map[string]bool{}
	for rows.Next() {
		var classid, objid uint32
		var objsubid int16
		var mode string
		if err := rows.Scan(&classid, &objid, &objsubid, &mode); err != nil {
			t.Fatal(err)
		}
		held[fmt.Sprintf("%d/%d/%d/%s", classid, objid, objsubid, mode)] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return held
}

// tagOf is lk's entry in serverHeld.
func tagOf(lk *advisory.Lock) string {
	classid, objid, objsubid := lk.Key().LockTag()
	mode := "ExclusiveLock"
	if lk.Shared() {
		mode = "ShareLock"
	}
	return fmt.Sprintf("%d/%d/%d/%s", classid, objid, objsubid, mode)
}

// tryAll runs TryLock (TryRLock when shared(i)) on keys[i] from one
// goroutine per key, all at once, and returns each call's lock and error.
func tryAll(ctx context.Context, l *advisory.Locker, keys []pglocks.Key, shared func(int) bool) ([]*advisory.Lock, []error) {
	locks, errs := make([]*advisory.Lock, len(keys)), make([]error, len(keys))
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Go(func() {
			if shared(i) {
				locks[i], errs[i] = l.TryRLock(ctx, key)
			} else {
				locks[i], errs[i] = l.TryLock(ctx, key)
			}
		})
	}
	wg.Wait()
	return locks, errs
}

// unlockAll unlocks every non-nil lock from a goroutine of its own.
func unlockAll(ctx context.Context, locks []*advisory.Lock) []error {
	errs := make([]error, len(locks))
	var wg sync.WaitGroup
	for i, lk := range locks {
		if lk != nil {
			wg.Go(func() { errs[i] = lk.Unlock(ctx) })
		}
	}
	wg.Wait()
	return errs
}

// On one session (MaxSessions 1), many goroutines' tries and unlocks are
// queued and pipelined in batches: behind a proxy that adds latency they
// finish in a few round trips, not one round trip each, and what the
// Locker says it holds is what pg_locks shows, before and after Unlock.
func TestQueuePipelined(t *testing.T) {
	t.Parallel()
	const n = 32
	const oneWay = 100 * time.Millisecond
	b, p, l := proxied(t, advisory.Config{MaxSessions: 1})
	ctx := ctxT(t)
	first, err := l.TryLock(ctx, pglocks.KeyOf("pipelined-first")) // opens the session before the latency
	if err != nil {
		t.Fatal(err)
	}
	p.SetLatency(oneWay)
	keys := make([]pglocks.Key, n)
	for i := range keys {
		keys[i] = pglocks.KeyOf(fmt.Sprintf("pipelined-%d", i))
	}
	start := time.Now()
	locks, errs := tryAll(ctx, l, keys, func(i int) bool { return i%2 == 1 })
	took := time.Since(start)
	want := map[string]bool{tagOf(first): true}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("try %d: %v", i, err)
		}
		want[tagOf(locks[i])] = true
	}
	// One by one, n tries take n round trips; pipelined, the first goes
	// alone (the session was idle) and the rest in one batch or two.
	t.Logf("%d tries took %v, %.1f round trips", n, took.Round(time.Millisecond), float64(took)/float64(2*oneWay))
	if limit := 8 * 2 * oneWay; took > limit {
		t.Errorf("%d tries on one session took %v, want ≤ %v (pipelined)", n, took, limit)
	}
	if got := serverHeld(t, b.pool, first.PID()); !equalSets(got, want) {
		t.Fatalf("pg_locks shows %v, the Locker holds %v", got, want)
	}
	start = time.Now()
	for i, err := range unlockAll(ctx, locks) {
		if err != nil {
			t.Fatalf("unlock %d: %v", i, err)
		}
	}
	if took := time.Since(start); took > 8*2*oneWay {
		t.Errorf("%d unlocks on one session took %v, want ≤ %v (pipelined)", n, took, 8*2*oneWay)
	}
	if got := serverHeld(t, b.pool, first.PID()); !equalSets(got, map[string]bool{tagOf(first): true}) {
		t.Fatalf("after Unlock pg_locks shows %v, want only %s", got, tagOf(first))
	}
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Many rounds of concurrent tries and unlocks on one session, exclusive
// and shared, several holders sharing a key (which ends a batch): after
// every round's tries and unlocks, pg_locks agrees with the Locker.
func TestQueuePipelinedRounds(t *testing.T) {
	t.Parallel()
	const n, rounds = 48, 20
	b := setup(t, advisory.Config{MaxSessions: 1})
	ctx := ctxT(t)
	keys := make([]pglocks.Key, n)
	for i := range keys {
		keys[i] = pglocks.KeyOf(fmt.Sprintf("rounds-%d", i))
		if i%3 == 2 {
			keys[i] = pglocks.KeyOf(fmt.Sprintf("rounds-shared-%d", i%4)) // shared by several
		}
	}
	shared := func(i int) bool { return i%3 == 2 }
	for round := range rounds {
		locks, errs := tryAll(ctx, b.locker, keys, shared)
		want := map[string]bool{}
		var pid uint32
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: try %d: %v", round, i, err)
			}
			want[tagOf(locks[i])], pid = true, locks[i].PID()
		}
		if got := serverHeld(t, b.pool, pid); !equalSets(got, want) {
			t.Fatalf("round %d: pg_locks shows %v, the Locker holds %v", round, got, want)
		}
		for i, err := range unlockAll(ctx, locks) {
			if err != nil {
				t.Fatalf("round %d: unlock %d: %v", round, i, err)
			}
		}
		if got := serverHeld(t, b.pool, pid); len(got) != 0 {
			t.Fatalf("round %d: after Unlock pg_locks shows %v", round, got)
		}
	}
}

func equalSets(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

// A session that dies while a batch is in flight — the server ran it, its
// replies are still on the way — leaves every request with a lock or an
// error, every lock of the session lost once the death is seen, and
// nothing held on the server. Reset loses the replies (a transport error
// on the batch's first reply); Terminate ends the backend after it ran the
// batch (the replies arrive, the death is seen after).
func TestSessionDiesMidBatch(t *testing.T) {
	t.Parallel()
	for _, fault := range []string{"Reset", "Terminate"} {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			diesMidBatch(t, fault == "Reset")
		})
	}
}

func diesMidBatch(t *testing.T, reset bool) {
	const n = 32
	const oneWay = 300 * time.Millisecond
	b, p, l := proxied(t, advisory.Config{MaxSessions: 1})
	ctx := ctxT(t)
	first, err := l.TryLock(ctx, pglocks.KeyOf("midbatch-first"))
	if err != nil {
		t.Fatal(err)
	}
	pid := first.PID()
	p.SetLatency(oneWay)
	keys := make([]pglocks.Key, n)
	for i := range keys {
		keys[i] = pglocks.KeyOf(fmt.Sprintf("midbatch-%d", i))
	}
	type result struct {
		locks []*advisory.Lock
		errs  []error
	}
	done := make(chan result)
	go func() {
		locks, errs := tryAll(ctx, l, keys, func(i int) bool { return i%2 == 1 })
		done <- result{locks, errs}
	}()
	// The first try goes alone (the session was idle), the rest in a
	// batch: strike once the server ran more than one of them.
	waitFor(t, "the batch to run on the server", 10*time.Second, func() bool { return len(serverHeld(t, b.pool, pid)) > 2 })
	if reset {
		p.Reset()
	} else if err := b.db.Server.TerminateBackend(ctx, pid); err != nil {
		t.Fatal(err)
	}
	p.SetLatency(0) // for the tries retried on a new session
	res := <-done
	var locks []*advisory.Lock
	for i, err := range res.errs {
		switch {
		case err == nil && res.locks[i] != nil:
			locks = append(locks, res.locks[i])
		case err == nil:
			t.Errorf("try %d: no lock and no error", i)
		case errors.Is(err, advisory.ErrLocked):
			t.Errorf("try %d on a free key: %v", i, err)
		default:
			t.Logf("try %d: %v", i, err)
		}
	}
	t.Logf("%d tries took the lock, %d failed", len(locks), n-len(locks))
	if !reset {
		// The death is seen when the session is next used.
		lk, err := l.TryLock(ctx, pglocks.KeyOf("midbatch-after"))
		if err != nil {
			t.Fatalf("TryLock after the death: %v", err)
		}
		locks = append(locks, lk)
	}
	for _, lk := range append(locks, first) {
		if lk.PID() == pid {
			waitLost(t, lk, time.Now(), 5*time.Second)
		}
	}
	waitFor(t, "the dead backend's locks to be freed", 10*time.Second, func() bool { return len(serverHeld(t, b.pool, pid)) == 0 })
	for _, lk := range locks {
		if lk.PID() != pid {
			if got := serverHeld(t, b.pool, lk.PID()); !got[tagOf(lk)] {
				t.Errorf("lock %v held by the Locker on pid %d, not on the server (%v)", lk.Key(), lk.PID(), got)
			}
		}
	}
}

// Unlocks that the server refuses in the middle of a batch (no EXECUTE on
// pg_advisory_unlock(bigint); the pair form is allowed) are settled from
// pg_locks after the batch, each as if it ran alone: the refused ones
// leave their locks held and say so, the others unlock, and pg_locks
// agrees with the Locker.
func TestBatchSettlesRefusedUnlocks(t *testing.T) {
	t.Parallel()
	const n = 32
	db := pgtest.New(t)
	role := createRole(t, db)
	ctx := ctxT(t)
	p, dsn := db.Proxy(t)
	l := newLocker(t, lazyPool(t, withUser(t, dsn, role, "right")), advisory.Config{MaxSessions: 1})
	admin := db.NewPool(t)
	locks := make([]*advisory.Lock, n)
	for i := range locks {
		key := pglocks.Int64Key(int64(1000 + i))
		if i%2 == 1 {
			key = pglocks.PairKey(7, int32(i))
		}
		lk, err := l.TryLock(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		locks[i] = lk
	}
	if _, err := admin.Exec(ctx, "revoke execute on function pg_advisory_unlock(bigint) from public"); err != nil {
		t.Fatal(err)
	}
	p.SetLatency(20 * time.Millisecond) // the unlocks queue behind the first
	want := map[string]bool{}
	for i, err := range unlockAll(ctx, locks) {
		switch {
		case i%2 == 1 && err != nil:
			t.Errorf("unlock %d (pair key): %v", i, err)
		case i%2 == 0 && (err == nil || !strings.Contains(err.Error(), "still held")):
			t.Errorf("unlock %d (int64 key) = %v, want an error saying the lock is still held", i, err)
		case i%2 == 0:
			want[tagOf(locks[i])] = true
			if err := locks[i].Err(); err != nil {
				t.Errorf("lock %d lost by a refused unlock: %v", i, err)
			}
		}
	}
	if got := serverHeld(t, admin, locks[0].PID()); !equalSets(got, want) {
		t.Fatalf("pg_locks shows %v, the Locker holds %v", got, want)
	}
	if _, err := admin.Exec(ctx, "grant execute on function pg_advisory_unlock(bigint) to public"); err != nil {
		t.Fatal(err)
	}
	for i, err := range unlockAll(ctx, locks) {
		if i%2 == 0 && err != nil {
			t.Errorf("unlock %d again: %v", i, err)
		}
	}
	if got := serverHeld(t, admin, locks[0].PID()); len(got) != 0 {
		t.Fatalf("after Unlock pg_locks shows %v", got)
	}
}
