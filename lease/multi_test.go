package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/lease"
)

func TestAcquireAllAllOrNone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	ls, err := b.store.TryAcquireAll(ctx, []string{"c", "a", "b"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 3 || ls[0].Name() != "c" || ls[1].Name() != "a" || ls[2].Name() != "b" {
		t.Fatalf("leases %v, want c, a, b in the order asked", ls)
	}
	for _, l := range ls {
		if l.Token() != 1 {
			t.Errorf("%s token %d, want 1", l.Name(), l.Token())
		}
	}
	// b is held: {b, d} takes nothing, d stays unacquired.
	_, err = b.store.TryAcquireAll(ctx, []string{"d", "b"}, time.Minute)
	var held *lease.HeldAllError
	if !errors.As(err, &held) || !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("err = %v, want a *HeldAllError", err)
	}
	if len(held.Held) != 1 || held.Held[0].Name != "b" || held.Held[0].Token != 1 {
		t.Fatalf("held = %+v, want b with token 1", held.Held)
	}
	var one *lease.HeldError
	if !errors.As(err, &one) || one.Name != "b" {
		t.Fatalf("errors.As *HeldError = %v", one)
	}
	if _, err := b.store.Get(ctx, "d"); !errors.Is(err, lease.ErrNotFound) {
		t.Fatalf("d after a failed try: %v, want ErrNotFound (nothing written)", err)
	}
	for _, l := range ls {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ls2, err := b.store.TryAcquireAll(ctx, []string{"a", "b", "d"}, time.Minute, lease.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int64{2, 2, 1} {
		if ls2[i].Token() != want {
			t.Errorf("%s token %d, want %d", ls2[i].Name(), ls2[i].Token(), want)
		}
	}
	for _, l := range ls2 {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFailedTryAllWritesNothing: a TryAcquireAll that finds one name held
// assigns no transaction id and leaves every row's xmin/xmax as it was,
// checked by replaying its exact statement inside a transaction.
func TestFailedTryAllWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	rec := &recorder{}
	pool := b.db.NewPool(t, rec.install)
	s := newStore(t, pool, lease.Config{})
	mustTry(t, b.store, "busy", time.Minute)
	free := mustTry(t, b.store, "free", time.Minute)
	if err := free.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rowVersions := func(q interface {
		Query(context.Context, string, ...any) (pgx.Rows, error)
	}) string {
		rows, err := q.Query(ctx, "select string_agg(name || xmin::text || '/' || xmax::text, ',' order by name) from pglocks_leases", pgx.QueryExecModeExec)
		if err != nil {
			t.Fatal(err)
		}
		v, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := rowVersions(b.pool)
	if _, err := s.TryAcquireAll(ctx, []string{"free", "busy", "new"}, time.Minute); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("err = %v, want ErrHeld", err)
	}
	sql, args := rec.last()
	if sql == "" {
		t.Fatal("the tracer saw no acquire statement")
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var xid *string
	if err := tx.QueryRow(ctx, "select pg_current_xact_id_if_assigned()::text").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	if xid != nil {
		t.Errorf("a failed try assigned transaction id %s: it wrote", *xid)
	}
	if after := rowVersions(tx); after != before {
		t.Errorf("rows went from %s to %s: the failed try touched them", before, after)
	}
}

func TestAcquireAllBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	many := make([]string, lease.MaxAcquireAll+1)
	for i := range many {
		many[i] = "n" + strings.Repeat("x", i)
	}
	for _, c := range []struct {
		names []string
		ttl   time.Duration
		want  string
	}{
		{nil, time.Minute, "empty"},
		{[]string{"a", "b", "a"}, time.Minute, "twice"},
		{[]string{"a", ""}, time.Minute, "name 1"},
		{many, time.Minute, "MaxAcquireAll"},
		{[]string{"a"}, 0, "ttl"},
		{[]string{"a"}, 1000 * time.Hour, "MaxTTL"},
	} {
		for _, f := range []func(context.Context, []string, time.Duration, ...lease.Option) ([]*lease.Lease, error){b.store.TryAcquireAll, b.store.AcquireAll} {
			ls, err := f(ctx, c.names, c.ttl)
			if err == nil || !strings.Contains(err.Error(), c.want) || ls != nil {
				t.Errorf("%v, %v: err = %v, want one naming %q", c.names, c.ttl, err, c.want)
			}
		}
	}
	var nilCtx context.Context
	if _, err := b.store.TryAcquireAll(nilCtx, []string{"a"}, time.Minute); err == nil || !strings.Contains(err.Error(), "nil context") {
		t.Errorf("nil ctx: %v", err)
	}
	if l, err := b.store.List(ctx); err != nil || len(l) != 0 {
		t.Errorf("held after bad input: %v, %v", l, err)
	}
}

func TestAcquireAllWaitsForRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	h1 := mustTry(t, b.store, "w1", time.Hour)
	h2 := mustTry(t, b.store, "w2", time.Hour)
	other := newStore(t, b.pool, lease.Config{})
	got := make(chan []*lease.Lease, 1)
	go func() {
		ls, err := other.AcquireAll(ctx, []string{"w2", "w0", "w1"}, time.Minute)
		if err != nil {
			t.Error(err)
		}
		got <- ls
	}()
	waitParked(t, other)
	if err := h1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
		t.Fatal("AcquireAll returned while w2 was held")
	default:
	}
	start := time.Now()
	if err := h2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var ls []*lease.Lease
	select {
	case ls = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("AcquireAll not woken by the releases")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("woken after %v: not by the NOTIFY", d)
	}
	if len(ls) != 3 || ls[0].Token() != 2 || ls[1].Token() != 1 || ls[2].Token() != 2 {
		t.Fatalf("leases %v", ls)
	}
	for _, l := range ls {
		_ = l.Release(ctx)
	}
}
