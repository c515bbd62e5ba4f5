package shard

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// TestFreeShardDivergentMemories: two members whose memories of a free
// shard's last owner differ (h read it held by o; o never read itself
// holding it: it took and gave it up between two of its reads) each leave
// it to the other — h plans it back to its last owner o, o plans it by
// the shared read, which gives it to h — and nobody takes it. Once the
// reads have found it free for longer than TTL, the members forget its
// last owner, plan it from the shared read alone and agree: h takes it.
// Before, it stayed free for as long as the members ran (TestStress saw a
// shard unowned for 2 minutes). The members' loops are driven by hand, so
// that their memories are the test's.
func TestFreeShardDivergentMemories(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	shards := []string{"a", "b", "c"} // two members: room for 1 each, and 2 for one of them
	// h is the member the fixed order gives the room for two.
	ids := []string{"p", "q"}
	mh := []uint64{mix(hash64(ids[0])), mix(hash64(ids[1]))}
	h, o := ids[0], ids[1]
	if capacities(len(shards), ids, mh, []int{0, 0})[1] == 2 {
		h, o = o, h
	}
	type run struct {
		m   *Member
		row *lease.Lease
		o   *owners
	}
	start := func(id, holds string) run {
		st, err := lease.New(db.NewPool(t), lease.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close(context.Background()) })
		m, err := New(Config{Group: "g", Shards: shards, Store: st, Identity: id, TTL: ttl, PollInterval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		row, err := m.join(ctx)
		if err != nil {
			t.Fatal(err)
		}
		octx, stop := context.WithCancel(ctx)
		ow := newOwners(octx, m, func(ctx context.Context, _ Shard) { <-ctx.Done() }, row.Token())
		t.Cleanup(func() { stop(); ow.wait() })
		ow.set([]string{holds})
		return run{m, row, ow}
	}
	// h holds a, o holds b, c is free; h remembers o as c's last owner.
	rh, ro := start(h, "a"), start(o, "b")
	rh.m.mu.Lock()
	rh.m.last = map[string]string{"c": o}
	rh.m.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for !slices.Equal(rh.m.Owned(), []string{"a"}) || !slices.Equal(ro.m.Owned(), []string{"b"}) {
		if time.Now().After(deadline) {
			t.Fatalf("h owns %v, o %v; want a and b", rh.m.Owned(), ro.m.Owned())
		}
		<-time.After(10 * time.Millisecond) // polling a condition
	}
	begin := time.Now()
	for {
		rh.m.reconcile(ctx, rh.row, rh.o)
		ro.m.reconcile(ctx, ro.row, ro.o)
		if own := append(rh.m.Owned(), ro.m.Owned()...); len(own) == 3 {
			t.Logf("c taken by h after %v (TTL %v): h owns %v, o %v", time.Since(begin).Round(time.Millisecond), ttl, rh.m.Owned(), ro.m.Owned())
			if !slices.Equal(rh.m.Owned(), []string{"a", "c"}) {
				t.Errorf("h owns %v, want a and c", rh.m.Owned())
			}
			return
		}
		if time.Since(begin) > 5*ttl {
			t.Fatalf("c still free after %v (TTL %v): h owns %v, o %v", time.Since(begin), ttl, rh.m.Owned(), ro.m.Owned())
		}
		<-time.After(50 * time.Millisecond) // the members' poll
	}
}
