package lease_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// TestForget: Forget deletes a free row whose token is the one given and
// nothing else; the name starts over at token 1, and the store that forgot
// it takes it again without taking that for a regression.
func TestForget(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	l := mustTry(t, b.store, "member:a", time.Minute)
	_ = l.Release(ctx)
	l = mustTry(t, b.store, "member:a", time.Minute)
	if l.Token() != 2 {
		t.Fatalf("token %d, want 2", l.Token())
	}
	if ok, err := b.store.Forget(ctx, "member:a", 2); ok || err != nil {
		t.Errorf("Forget of a held row = %v, %v; want false, nil", ok, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.store.Forget(ctx, "member:a", 1); ok || err != nil {
		t.Errorf("Forget with an older token = %v, %v; want false, nil", ok, err)
	}
	if ok, err := b.store.Forget(ctx, "member:a", 2); !ok || err != nil {
		t.Errorf("Forget of the released row = %v, %v; want true, nil", ok, err)
	}
	l = mustTry(t, b.store, "member:a", time.Minute)
	if l.Token() != 1 {
		t.Errorf("token after Forget %d, want 1", l.Token())
	}
	var nilCtx context.Context
	if _, err := b.store.Forget(nilCtx, "member:a", 1); err == nil {
		t.Errorf("Forget(nil ctx) = nil")
	}
}

// TestForgetIdle: ForgetIdle deletes free rows under the prefix idle for
// longer than idle whose metadata contains match, and no other.
func TestForgetIdle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	md := func(s string) json.RawMessage { return json.RawMessage(s) }
	for _, n := range []string{"grp:old", "grp:foreign", "grp:recent", "other:old"} {
		_ = mustTry(t, b.store, n, time.Minute, leaseWithMeta(n)).Release(ctx)
	}
	held := mustTry(t, b.store, "grp:held", time.Minute, leaseWithMeta("grp:held"))
	exec(t, b.pool, `update pglocks_leases set expires_at = now() - interval '2 days' where name in ('grp:old', 'grp:foreign', 'other:old', 'grp:held')`)
	exec(t, b.pool, `update pglocks_leases set metadata = '{"group":"x"}' where name = 'grp:foreign'`)
	n, err := b.store.ForgetIdle(ctx, "grp:", 24*time.Hour, md(`{"group":"grp"}`))
	if err != nil || n != 2 { // grp:old and grp:held, expired two days ago
		t.Errorf("ForgetIdle = %d, %v; want 2 rows (grp:old, and grp:held, which expired)", n, err)
	}
	for _, name := range []string{"grp:foreign", "grp:recent", "other:old"} {
		if _, err := b.store.Get(ctx, name); err != nil {
			t.Errorf("%s: %v (should remain)", name, err)
		}
	}
	_ = held
	if _, err := b.store.ForgetIdle(ctx, "", time.Hour, nil); err == nil {
		t.Errorf("ForgetIdle with an empty prefix = nil")
	}
}

// leaseWithMeta records {"group": the name's prefix} with the acquisition.
func leaseWithMeta(name string) lease.Option {
	g, _, _ := strings.Cut(name, ":")
	doc, _ := json.Marshal(map[string]string{"group": g})
	return lease.WithMetadata(doc)
}
