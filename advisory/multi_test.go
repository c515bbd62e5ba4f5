package advisory_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// appHeld returns the advisory locks granted on the server to sessions
// whose application_name is app, as pg_locks' (classid, objid, objsubid)
// formatted, with how many sessions hold each exclusively.
func appHeld(t testing.TB, ctx context.Context, pool *pgxpool.Pool, app string) map[string]int {
	t.Helper()
	rows, err := pool.Query(ctx, `select l.classid::int8 << 32 | l.objid::int8, l.objsubid, count(*)
		from pg_locks l join pg_stat_activity a on a.pid = l.pid
		where l.locktype = 'advisory' and l.granted and l.mode = 'ExclusiveLock' and a.application_name = $1
		group by 1, 2`, app)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var v int64
		var sub int16
		var n int
		if err := rows.Scan(&v, &sub, &n); err != nil {
			t.Fatal(err)
		}
		k := pglocks.Int64Key(v)
		if sub == 2 {
			k = pglocks.PairKey(int32(v>>32), int32(uint32(v)))
		}
		out[k.String()] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TryLockAll takes every key or none; a failed try leaves nothing held on
// the server, and the keys of both spaces are taken as psql would.
func TestTryLockAllLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := newLocker(t, b.pool, advisory.Config{ApplicationName: b.app})
	ctx := ctxT(t)
	keys := []pglocks.Key{pglocks.KeyOf("all-a"), pglocks.PairKey(-7, -1), pglocks.Int64Key(-5), pglocks.PairKey(3, 4)}
	ls, err := b.locker.TryLockAll(ctx, keys...)
	if err != nil {
		t.Fatal(err)
	}
	if got := appHeld(t, ctx, b.pool, b.app); len(got) != len(keys) {
		t.Fatalf("server holds %v, want the %d keys", got, len(keys))
	}
	for _, k := range keys {
		if held, err := advisory.IsHeld(ctx, b.pool, k); err != nil || !held {
			t.Fatalf("IsHeld(%s) = %v, %v", k, held, err)
		}
	}
	// Overlapping on the last key only: the other locker takes nothing.
	_, err = other.TryLockAll(ctx, pglocks.KeyOf("all-b"), pglocks.KeyOf("all-c"), pglocks.PairKey(3, 4))
	if !errors.Is(err, advisory.ErrLocked) {
		t.Fatalf("overlapping TryLockAll: %v, want ErrLocked", err)
	}
	if got := appHeld(t, ctx, b.pool, b.app); len(got) != len(keys) {
		t.Fatalf("after a failed TryLockAll the server holds %v, want only the first set", got)
	}
	// The same locker: its own locks make the set busy too.
	if _, err := b.locker.TryLockAll(ctx, pglocks.KeyOf("all-b"), pglocks.Int64Key(-5)); !errors.Is(err, advisory.ErrLocked) {
		t.Fatalf("TryLockAll over this locker's own lock: %v, want ErrLocked", err)
	}
	if err := ls.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if got := appHeld(t, ctx, b.pool, b.app); len(got) != 0 {
		t.Fatalf("after Unlock the server holds %v", got)
	}
	select {
	case <-ls.Lost():
		t.Fatal("Lost closed by Unlock")
	default:
	}
	if ls.Context().Err() == nil {
		t.Fatal("Context not cancelled by Unlock")
	}
	if err := ls.Unlock(ctx); !errors.Is(err, advisory.ErrNotHeld) {
		t.Fatalf("second Unlock: %v, want ErrNotHeld", err)
	}
}

// Bad input is refused with an error naming the problem, before anything
// is taken.
func TestLockAllBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	many := make([]pglocks.Key, advisory.MaxKeys+1)
	for i := range many {
		many[i] = pglocks.Int64Key(int64(i))
	}
	cases := map[string]struct {
		ctx  context.Context
		keys []pglocks.Key
		want string
	}{
		"Empty":     {ctx, nil, "lockall: no keys"},
		"Duplicate": {ctx, []pglocks.Key{pglocks.KeyOf("d"), pglocks.Int64Key(1), pglocks.KeyOf("d")}, "duplicate key"},
		"TooMany":   {ctx, many, "more than MaxKeys"},
		"ZeroKey":   {ctx, []pglocks.Key{pglocks.Int64Key(1), {}}, "key 1"},
		"NilCtx":    {nil, []pglocks.Key{pglocks.Int64Key(1)}, "nil context"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			for _, wait := range []bool{false, true} {
				var err error
				if wait {
					_, err = b.locker.LockAll(c.ctx, c.keys...)
				} else {
					_, err = b.locker.TryLockAll(c.ctx, c.keys...)
				}
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("wait=%v: %v, want an error saying %q", wait, err, c.want)
				}
				if name == "Empty" && strings.Contains(err.Error(), "Key(invalid)") {
					t.Errorf("wait=%v: %v names a key, though none was given", wait, err)
				}
			}
		})
	}
	if got := appHeld(t, ctx, b.pool, b.app); len(got) != 0 {
		t.Fatalf("server holds %v after bad input", got)
	}
}

// A terminated session loses the whole set at once.
func TestLockAllLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	ls, err := b.locker.LockAll(ctx, pglocks.KeyOf("lost-a"), pglocks.KeyOf("lost-b"))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.db.Server.TerminateBackend(ctx, ls.PID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ls.Lost():
	case <-ctx.Done():
		t.Fatal("Lost not closed after the session was terminated")
	}
	if !errors.Is(ls.Err(), advisory.ErrLost) || !errors.Is(context.Cause(ls.Context()), advisory.ErrLost) {
		t.Fatalf("Err = %v, Cause = %v, want ErrLost", ls.Err(), context.Cause(ls.Context()))
	}
	// Nothing stays held: the keys are free for the next caller.
	again, err := b.locker.LockAll(ctx, pglocks.KeyOf("lost-b"), pglocks.KeyOf("lost-a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A TryLockAll that fills the server's lock table part-way through its
// statement (two entries free, five keys asked) fails with
// ErrLockTableFull and leaves none of its keys held: the statement failed
// after taking some, and the Locker unlocks those it finds in pg_locks;
// the session and its other locks survive.
func TestTryLockAllTableFull(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t, pgtest.WithMaxConnections(10),
		pgtest.WithSetting("max_locks_per_transaction", "10"), pgtest.WithSetting("autovacuum", "off"))
	db := srv.NewDB(t)
	ctx := ctxT(t)
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 2 })
	l := newLocker(t, pool, advisory.Config{MaxSessions: 1})
	filler, conn := db.Conn(t), db.Conn(t)
	kept, err := l.TryLock(ctx, pglocks.Int64Key(1))
	if err != nil {
		t.Fatal(err)
	}
	fillLockTable(ctx, t, filler)
	if _, err := filler.Exec(ctx, "select pg_advisory_unlock(k) from generate_series($1::int8, $1 + 1) k", int64(fillBase)); err != nil {
		t.Fatal(err)
	}
	keys := []pglocks.Key{pglocks.Int64Key(11), pglocks.Int64Key(12), pglocks.Int64Key(13), pglocks.Int64Key(14), pglocks.Int64Key(15)}
	_, err = l.TryLockAll(ctx, keys...)
	if !errors.Is(err, advisory.ErrLockTableFull) {
		t.Fatalf("TryLockAll on a nearly full table: %v, want ErrLockTableFull", err)
	}
	var n int
	if err := conn.QueryRow(ctx, `select count(*) from pg_locks where locktype = 'advisory' and pid = $1 and objid between 11 and 15`,
		int32(kept.PID())).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 || kept.Err() != nil {
		t.Fatalf("after the failed TryLockAll the session holds %d of its keys; the kept lock: %v", n, kept.Err())
	}
	if _, err := filler.Exec(ctx, "select pg_advisory_unlock_all()"); err != nil {
		t.Fatal(err)
	}
	ls, err := l.TryLockAll(ctx, keys...)
	if err != nil {
		t.Fatalf("TryLockAll once the table has room: %v", err)
	}
	if ls.PID() != kept.PID() {
		t.Errorf("the set was taken on session %d, the kept lock is on %d", ls.PID(), kept.PID())
	}
	if err := errors.Join(ls.Unlock(ctx), kept.Unlock(ctx)); err != nil {
		t.Fatal(err)
	}
}
