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
	const ttl = 3 * time.Second // 2 s is tight for a member row on a loaded machine
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	shards := []string{"a", "b", "c"} // two members: room for 1 each, and 2 for one of them
	h, o := winner(shards)
	start := func(id, holds string) driven { return startDriven(t, ctx, db, id, holds, shards, ttl) }
	// h holds a, o holds b, c is free; h remembers o as c's last owner.
	rh, ro := start(h, "a"), start(o, "b")
	rh.m.mu.Lock()
	rh.m.last = map[string]string{"c": o}
	rh.m.mu.Unlock()
	waitOwned(t, map[string]driven{"a": rh, "b": ro})
	begin := time.Now()
	for i := 0; ; i++ {
		rh.m.reconcile(ctx, rh.row, rh.o)
		ro.m.reconcile(ctx, ro.row, ro.o)
		if i == 0 {
			// The state under test: each plans c to the other.
			both := []string{h, o}
			if th, to := rh.m.Target(o, both), ro.m.Target(h, both); !slices.Contains(th, "c") || !slices.Contains(to, "c") {
				t.Fatalf("h plans %v for o, o plans %v for h; want c in both", th, to)
			}
		}
		if own := append(rh.m.Owned(), ro.m.Owned()...); len(own) == 3 {
			t.Logf("c taken by h after %v (TTL %v): h owns %v, o %v", time.Since(begin).Round(time.Millisecond), ttl, rh.m.Owned(), ro.m.Owned())
			if !slices.Equal(rh.m.Owned(), []string{"a", "c"}) {
				t.Errorf("h owns %v, want a and c", rh.m.Owned())
			}
			return
		}
		if time.Since(begin) > 5*ttl {
			t.Fatalf("c still free after %v (TTL %v): h owns %v, o %v; member rows: h %v, o %v",
				time.Since(begin), ttl, rh.m.Owned(), ro.m.Owned(), rh.row.Err(), ro.row.Err())
		}
		<-time.After(50 * time.Millisecond) // the members' poll
	}
}

// winner returns two identities: h, which the fixed order gives the room
// for two of shards (two members), and o.
func winner(shards []string) (h, o string) {
	ids := []string{"p", "q"}
	mh := []uint64{mix(hash64(ids[0])), mix(hash64(ids[1]))}
	if capacities(len(shards), ids, mh, []int{0, 0})[1] == 2 {
		return ids[1], ids[0]
	}
	return ids[0], ids[1]
}

// driven is a member of group "g" whose loop the test runs by hand.
type driven struct {
	m   *Member
	row *lease.Lease
	o   *owners
}

// startDriven joins member id to group "g" of shards, on a store of its
// own, and starts its owner of shard holds; its loop is not run.
func startDriven(t *testing.T, ctx context.Context, db *pgtest.DB, id, holds string, shards []string, ttl time.Duration) driven {
	t.Helper()
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
	return driven{m, row, ow}
}

// waitOwned waits until each member owns the one shard it was started
// with.
func waitOwned(t *testing.T, ds map[string]driven) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for s, d := range ds {
		for !slices.Equal(d.m.Owned(), []string{s}) {
			if time.Now().After(deadline) {
				t.Fatalf("a member owns %v; want %s", d.m.Owned(), s)
			}
			<-time.After(10 * time.Millisecond) // polling a condition
		}
	}
}

// TestLastOwnerKeepsItsClaim: a member that lost a shard's lease and
// cannot take it again (here a lease without a member's metadata, as an
// older pglocks or a hand-made one holds it, keeps it) goes on wanting it
// however long its reads find it free: it forgets other members as a free
// shard's last owner after TTL, never itself, so its claim to the room
// for one more stands.
func TestLastOwnerKeepsItsClaim(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	shards := []string{"a", "b", "c"}
	h, o := winner(shards)
	st, err := lease.New(db.NewPool(t), lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	if _, err := st.Acquire(ctx, "g#s:c", time.Minute, lease.WithKeepAlive()); err != nil {
		t.Fatal(err)
	}
	rh, ro := startDriven(t, ctx, db, h, "a", shards, ttl), startDriven(t, ctx, db, o, "b", shards, ttl)
	ro.m.mu.Lock()
	ro.m.last = map[string]string{"c": o} // o held c last
	ro.m.mu.Unlock()
	waitOwned(t, map[string]driven{"a": rh, "b": ro})
	for begin := time.Now(); time.Since(begin) < 2*ttl; <-time.After(50 * time.Millisecond) {
		rh.m.reconcile(ctx, rh.row, rh.o)
		ro.m.reconcile(ctx, ro.row, ro.o)
	}
	if want := ro.m.Target(o, []string{h, o}); !slices.Contains(want, "c") {
		t.Fatalf("o's target after 2 TTLs of c held by a stranger: %v, want c in it", want)
	}
	if ro.o.want["c"] == nil {
		t.Fatal("o no longer tries to take c")
	}
}
