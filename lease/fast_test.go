package lease_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
)

// TestFastRetake: a store that released a name itself takes it again with
// the plain UPDATE of a released row (it costs the server less),
// and when another store took the row since, it falls back to the retake,
// which still reports the holder, takes an expired row and tells its old
// holder of the takeover. A failed fast try writes nothing.
func TestFastRetake(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	rec := &recorder{}
	a := newStore(t, b.db.NewPool(t, rec.install), lease.Config{})
	other := b.store
	// check takes the acquire statements since the last check and compares
	// which were the fast retake with want.
	check := func(what string, want ...bool) []traced {
		t.Helper()
		stmts := rec.take()
		got := make([]bool, len(stmts))
		for i, st := range stmts {
			got[i] = isFastAcquire(st.sql)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s: acquire statements fast = %v, want %v", what, got, want)
		}
		return stmts
	}

	l := mustTry(t, a, "fast", time.Minute)
	check("first acquisition", false)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l = mustTry(t, a, "fast", time.Minute)
	fast := check("after its own release", true)[0]
	if l.Token() != 2 {
		t.Fatalf("token %d, want 2", l.Token())
	}
	attempt := fast.args[6] // the id an unknown outcome is cleaned up by
	var recorded bool
	if err := b.pool.QueryRow(ctx, "select attempt = $1 from pglocks_leases where name = 'fast'", pgx.QueryExecModeExec, attempt).Scan(&recorded); err != nil || !recorded {
		t.Fatalf("the fast retake did not record its attempt id %v: %v", attempt, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	taken := mustTry(t, other, "fast", time.Minute) // the hint is stale now
	_, err := a.TryAcquire(ctx, "fast", time.Minute)
	var held *lease.HeldError
	if !errors.As(err, &held) || held.Owner != taken.Owner() || held.Token != 3 {
		t.Fatalf("try of a row another store took: %v, want a HeldError naming token 3", err)
	}
	failedFastWritesNothing(t, b.pool, check("stale hint", true, false)[0])

	eventually(t, 10*time.Second, "the holder's listener", func() bool { return lease.Listening(other) })
	expire(t, b.pool, "fast")
	l = mustTry(t, a, "fast", time.Minute)
	check("holder seen: expired row", false)
	if l.Token() != 4 {
		t.Fatalf("token %d, want 4", l.Token())
	}
	waitFor(t, taken.Lost(), 30*time.Second, "the takeover notice to the expired holder")

	// A release lost in a crash: the row shows the released acquisition
	// again, with the token the store saw last. The first try finds it not
	// released; the store drops its hint, and later tries go straight to
	// the retake.
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	exec(t, b.pool, "update pglocks_leases set owner = $1, expires_at = now() + interval '1 minute' where name = 'fast'", l.Owner())
	for i, want := range [][]bool{{true, false}, {false}} {
		if _, err := a.TryAcquire(ctx, "fast", time.Minute); !errors.Is(err, lease.ErrHeld) {
			t.Fatalf("try %d of the row whose release was lost: %v, want ErrHeld", i, err)
		}
		check("release lost", want...)
	}
}

// failedFastWritesNothing replays fast, a fast retake of a held row, in a
// transaction: it must take no row lock and assign no transaction id.
func failedFastWritesNothing(t *testing.T, pool *pgxpool.Pool, fast traced) {
	t.Helper()
	ctx := ctxT(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	tag, err := tx.Exec(ctx, fast.sql, fast.args...)
	if err != nil || tag.RowsAffected() != 0 {
		t.Fatalf("replayed fast retake of a held row: %v, %v rows", err, tag.RowsAffected())
	}
	var xid *string
	if err := tx.QueryRow(ctx, "select pg_current_xact_id_if_assigned()::text").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	if xid != nil {
		t.Errorf("a failed fast try assigned transaction id %s: it wrote", *xid)
	}
}
