package shard

import (
	"context"
	"fmt"
	"maps"
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

// TestForgetStaleRule: a member forgets the last owner of a shard read
// unowned for longer than TTL — another member always, itself only when
// the shard's lease is held by a non-member — and nothing read unowned
// for less.
func TestForgetStaleRule(t *testing.T) {
	m := &Member{cfg: Config{Identity: "o", TTL: time.Second}}
	shards := []string{"c", "d", "e", "f"}
	now := time.Now()
	m.last = map[string]string{"c": "o", "d": "h", "e": "o", "f": "h"}
	old := now.Add(-2 * time.Second)
	m.freeSince = map[string]time.Time{"c": old, "d": old, "e": old}
	m.forgetStale(shards, view{owners: map[string]string{}, taken: map[string]bool{"e": true}}, now)
	if want := map[string]string{"c": "o", "f": "h"}; !maps.Equal(m.last, want) {
		t.Errorf("last = %v, want %v (c: its own, free; f: unowned for no time yet)", m.last, want)
	}
	if !m.freeSince["f"].Equal(now) || !m.freeSince["c"].Equal(old) {
		t.Errorf("freeSince = %v", m.freeSince)
	}
	m.forgetStale(shards, view{owners: map[string]string{"c": "o", "d": "h", "e": "h", "f": "h"}}, now)
	if len(m.freeSince) != 0 {
		t.Errorf("freeSince = %v after a read of every shard owned", m.freeSince)
	}
}

// TestFreeShardBesideStranger: a shard held by a non-member (c: a lease
// without a member's metadata, as an older pglocks or a hand-made one
// holds it) that one member remembers as its own must not stall another
// free shard (d). o, which remembers c, claims the room for two and plans
// d to h; h, which does not, gives that room to o by the fixed order and
// plans d to o: nobody takes d. Once c has been unowned for longer than
// TTL, o forgets it too, and both plan from the shared read: d is taken.
// The names are chosen, by the rule itself, so that the two plans cross.
func TestFreeShardBesideStranger(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	shards := []string{"a", "b", "c", "d"}
	h, o := crossed(t, shards)
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
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
	begin := time.Now()
	for i := 0; ; i++ {
		rh.m.reconcile(ctx, rh.row, rh.o)
		ro.m.reconcile(ctx, ro.row, ro.o)
		both := []string{h, o}
		if i == 0 && (!slices.Contains(ro.m.Target(h, both), "d") || !slices.Contains(rh.m.Target(o, both), "d")) {
			t.Fatalf("o plans %v for h, h plans %v for o; want d in both", ro.m.Target(h, both), rh.m.Target(o, both))
		}
		if own := append(rh.m.Owned(), ro.m.Owned()...); slices.Contains(own, "d") {
			t.Logf("d taken after %v (TTL %v): h owns %v, o %v", time.Since(begin).Round(time.Millisecond), ttl, rh.m.Owned(), ro.m.Owned())
			return
		}
		if time.Since(begin) > 5*ttl {
			t.Fatalf("d still free after %v (TTL %v): h owns %v, o %v; member rows: h %v, o %v",
				time.Since(begin), ttl, rh.m.Owned(), ro.m.Owned(), rh.row.Err(), ro.row.Err())
		}
		<-time.After(50 * time.Millisecond) // the members' poll
	}
}

// crossed returns identities h and o for which, with h owning a and o
// owning b of shards (a, b, c, d) and c and d free, o's plan with c
// remembered as its own gives d to h, and h's plan with no memory gives d
// to o.
func crossed(t *testing.T, shards []string) (h, o string) {
	for i := range 100 {
		h, o := fmt.Sprintf("h%d", i), fmt.Sprintf("o%d", i)
		members := memberSet([]string{h, o})
		owners := map[string]string{"a": h, "b": o}
		byO := targets(shards, members, owners, map[string]string{"c": o})
		byH := targets(shards, members, owners, nil)
		if byO[3] == h && byH[3] == o {
			return h, o
		}
	}
	t.Fatal("no identities whose plans cross")
	return "", ""
}
