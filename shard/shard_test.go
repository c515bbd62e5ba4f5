package shard_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/shard"
)

func TestBadInput(t *testing.T) {
	t.Parallel()
	g := newGroup(t, 3, 0, 0)
	st, err := lease.New(g.db.NewPool(t), lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	for _, c := range []struct {
		cfg  shard.Config
		want string
	}{
		{shard.Config{Shards: []string{"a"}, Store: st}, "Group"},
		{shard.Config{Group: "g", Store: st}, "Shards is empty"},
		{shard.Config{Group: "g", Shards: []string{"a", "b", "a"}, Store: st}, `"a" appears twice`},
		{shard.Config{Group: "g", Shards: []string{"a", ""}, Store: st}, "Shards[1]"},
		{shard.Config{Group: "g", Shards: []string{"a"}}, "Store is required"},
		{shard.Config{Group: "g", Shards: []string{"a"}, Store: st, TTL: time.Millisecond}, "TTL"},
		{shard.Config{Group: "g", Shards: []string{"a"}, Store: st, PollInterval: time.Microsecond}, "PollInterval"},
		{shard.Config{Group: strings.Repeat("x", shard.MaxNameLen+1), Shards: []string{"a"}, Store: st}, "longer than"},
	} {
		_, err := shard.New(c.cfg)
		if !errors.Is(err, shard.ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want an error naming %q", c.cfg, err, c.want)
		}
	}
	m, err := shard.New(shard.Config{Group: "g", Shards: []string{"a"}, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetShards(nil); !errors.Is(err, shard.ErrInvalidConfig) {
		t.Errorf("SetShards(nil) = %v", err)
	}
	if err := m.SetShards([]string{"x", "x"}); !errors.Is(err, shard.ErrInvalidConfig) {
		t.Errorf("SetShards(duplicates) = %v", err)
	}
}

// TestJoinTwice: a second member with a live member's identity is refused
// with ErrIdentityInUse, from another Store as from the same one, and the
// first member keeps its shards. The first member's TTL leaves it room to
// renew on a loaded machine: a row that lapses while the duplicate waits
// for it is the duplicate's to take (the first member has then left).
func TestJoinTwice(t *testing.T) {
	t.Parallel()
	g := newGroup(t, 10, 5*time.Second, 50*time.Millisecond)
	first := g.join("a")
	g.settle(30 * time.Second)
	for _, st := range []*lease.Store{first.store, nil} {
		if st == nil {
			var err error
			if st, err = lease.New(g.db.NewPool(t), lease.Config{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close(context.Background()) })
		}
		m, err := shard.New(shard.Config{Group: g.name, Shards: g.shards, Store: st, Identity: "a"})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err = m.Run(ctx, func(context.Context, shard.Shard) { t.Error("a duplicate member ran a shard") })
		cancel()
		if !errors.Is(err, shard.ErrIdentityInUse) || !strings.Contains(err.Error(), `"a"`) {
			t.Fatalf("second Run = %v, want ErrIdentityInUse naming the identity", err)
		}
	}
	if own, _, _ := g.ownership(); len(own) != 10 {
		t.Fatalf("first member owns %d shards after the refused join", len(own))
	}
	// One Member, run twice at once.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := first.m.Run(ctx, func(context.Context, shard.Shard) {}); !errors.Is(err, shard.ErrRunning) {
		t.Fatalf("Run of a running Member = %v, want ErrRunning", err)
	}
}

// TestBalanceJoinLeave: N = 100 shards, members join one by one up to 5 and
// leave one by one: after each settle every shard has one owner, loads
// differ by at most one, and the shards that moved are exactly those the
// assignment moves — ⌊N/M⌋ to a joiner, a leaver's own and no other —
// so at most ⌈N/M⌉, within the promised 1.2 × N/M; every write is fenced,
// and no superseded owner's write commits.
func TestBalanceJoinLeave(t *testing.T) {
	t.Parallel()
	const n = 100
	g := newGroup(t, n, 3*time.Second, 100*time.Millisecond)
	var (
		ids []string
		mc  *moveChecker
	)
	step := func(what string) {
		own := g.settle(60 * time.Second)
		if mc == nil {
			g.balanced(own)
			mc = newMoveChecker(t, g, own)
			return
		}
		mc.step(what, own, ids)
	}
	for i := range 5 {
		id := fmt.Sprintf("m%d", i)
		g.join(id)
		ids = append(ids, id)
		step("join " + id)
	}
	for len(ids) > 1 {
		id := ids[0]
		if err := g.stop(id, true); err != nil {
			t.Fatalf("Run of %s: %v", id, err)
		}
		ids = ids[1:]
		step("leave " + id)
	}
	g.checkNoOverlap()
}

// newCalcStore is a store for a Member used only to compute assignments.
func newCalcStore(t *testing.T, g *group) *lease.Store {
	st, err := lease.New(g.db.NewPool(t), lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	return st
}

// TestMemberDeath: a member whose store is closed under it (its rows left
// to expire, as a crash leaves them) has its shards taken over within
// TTL + PollInterval (plus scheduling slack); a member whose connections
// are all terminated keeps its shards (the keep-alive renews through new
// connections) and the group stays settled.
func TestMemberDeath(t *testing.T) {
	t.Parallel()
	const ttl, poll = 2 * time.Second, 100 * time.Millisecond
	g := newGroup(t, 30, ttl, poll)
	for _, id := range []string{"a", "b", "c"} {
		g.join(id)
	}
	before := g.settle(60 * time.Second)

	n, err := g.db.TerminateApplication(context.Background(), "b")
	if err != nil || n == 0 {
		t.Fatalf("terminate b's backends: %d, %v", n, err)
	}
	after := g.settle(60 * time.Second)
	if d := movedCount(before, after); d != 0 {
		t.Errorf("%d shards moved after b's connections were terminated", d)
	}

	start := time.Now()
	if err := g.stop("c", false); !errors.Is(err, lease.ErrClosed) {
		t.Errorf("Run of a member whose store closed = %v, want ErrClosed", err)
	}
	own := g.settle(ttl + poll + 30*time.Second)
	took := time.Since(start)
	g.balanced(own)
	t.Logf("takeover of a dead member's shards took %v (TTL %v, poll %v)", took, ttl, poll)
	if took > ttl+poll+5*time.Second {
		t.Errorf("takeover took %v, bound TTL + PollInterval = %v", took, ttl+poll)
	}
	g.checkNoOverlap()
}
