package shard_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/shard"
)

// waitFor polls cond every 20 ms until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			for _, gr := range strings.Split(string(buf), "\n\n") {
				if strings.Contains(gr, "shard.") || strings.Contains(gr, "lease.") {
					t.Logf("%s", gr)
				}
			}
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, not synchronizing
	}
}

// runMember runs m until the test ends (or stop is called) with an fn
// that waits for its ctx and records the cause it ends with.
type ranMember struct {
	m      *shard.Member
	cancel context.CancelFunc
	done   chan error

	mu     sync.Mutex
	causes []error
	ended  error // Run's error, once it returned
	over   bool
}

// running fails the test if Run returned, and reports true.
func (r *ranMember) running(t *testing.T) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.over {
		t.Fatalf("Run returned early: %v", r.ended)
	}
	return true
}

func runMember(t *testing.T, m *shard.Member) *ranMember {
	ctx, cancel := context.WithCancel(context.Background())
	r := &ranMember{m: m, cancel: cancel, done: make(chan error, 1)}
	go func() {
		err := m.Run(ctx, func(ctx context.Context, s shard.Shard) {
			<-ctx.Done()
			r.mu.Lock()
			r.causes = append(r.causes, context.Cause(ctx))
			r.mu.Unlock()
		})
		r.mu.Lock()
		r.ended, r.over = err, true
		r.mu.Unlock()
		r.done <- err
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels Run and returns its error (nil once stopped).
func (r *ranMember) stop(t *testing.T) error {
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(time.Minute):
		t.Errorf("Run did not return within a minute of its ctx ending")
		return nil
	}
}

// TestListReplyLost: a member whose member-list read loses its reply (the
// statement runs, the answer never comes) is not stuck in it: the read is
// bounded, the member notices its row lost while the network is out, and
// once it heals it joins again and the group settles with both members.
func TestListReplyLost(t *testing.T) {
	t.Parallel()
	const ttl, poll = 2 * time.Second, 100 * time.Millisecond
	g := newGroup(t, 6, ttl, poll)
	g.join("b")
	proxy, dsn := g.db.Proxy(t)
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	// A connect whose reply is lost hangs without a connect timeout and
	// keeps its pool slot: the pool runs dry. Production pools set one.
	pcfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st, err := lease.New(pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	a, err := shard.New(shard.Config{Group: "g", Shards: g.shards, Store: st, Identity: "a", TTL: ttl, PollInterval: poll})
	if err != nil {
		t.Fatal(err)
	}
	runMember(t, a)
	t.Cleanup(proxy.Pass) // before runMember's stop, cleanups run last first
	bm := g.members["b"].m
	waitFor(t, 30*time.Second, "a and b own 3 shards each", func() bool { return len(a.Owned()) == 3 && len(bm.Owned()) == 3 })
	proxy.DropReplies()
	waitFor(t, 30*time.Second, "a, cut off, gives up its shards", func() bool { return len(a.Owned()) == 0 })
	waitFor(t, 30*time.Second, "b takes every shard", func() bool { return len(bm.Owned()) == 6 })
	proxy.Pass()
	waitFor(t, 30*time.Second, "a joins again and the group settles 3/3", func() bool {
		mem, _ := bm.Members(context.Background())
		return len(a.Owned()) == 3 && len(bm.Owned()) == 3 && slices.Equal(mem, []string{"a", "b"})
	})
}

// TestGroupNameHash: a group name with '#' is refused (it could make one
// group's lease names another's member rows), and leases of other groups
// whose names share a prefix with this group's are not counted as members.
func TestGroupNameHash(t *testing.T) {
	t.Parallel()
	g := newGroup(t, 4, 2*time.Second, 50*time.Millisecond)
	a := g.join("a")
	g.settle(30 * time.Second)
	st := newCalcStore(t, g)
	_, err := shard.New(shard.Config{Group: "g#m:x", Shards: []string{"q"}, Store: st})
	if !errors.Is(err, shard.ErrInvalidConfig) {
		t.Fatalf("New with Group %q = %v, want ErrInvalidConfig", "g#m:x", err)
	}
	// Group "g:m" and "gg": their member rows begin "g:m#m:", "gg#m:".
	for _, name := range []string{"g:m", "gg"} {
		o, err := shard.New(shard.Config{Group: name, Shards: []string{"q"}, Store: st, Identity: "y", TTL: 2 * time.Second, PollInterval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		r := runMember(t, o)
		waitFor(t, 30*time.Second, name+" owns its shard", func() bool { return len(o.Owned()) == 1 })
		mem, err := a.m.Members(context.Background())
		if err != nil || !slices.Equal(mem, []string{"a"}) {
			t.Fatalf("members of g with group %q running: %q, %v", name, mem, err)
		}
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(a.m.Owned()); n != 4 {
		t.Fatalf("lone member of group g owns %d of 4 shards", n)
	}
}

// TestRestartSameIdentity: a process restarting with the identity of one
// that crashed (its member row left to expire) joins once the row expires
// instead of failing with ErrIdentityInUse; a second live member with one
// identity is still refused, after at most two waits for its row.
func TestRestartSameIdentity(t *testing.T) {
	t.Parallel()
	const ttl, poll = 3 * time.Second, 50 * time.Millisecond
	g := newGroup(t, 4, ttl, poll)
	g.join("a")
	g.settle(30 * time.Second)
	if err := g.stop("a", false); !errors.Is(err, lease.ErrClosed) { // crash: rows left to expire
		t.Fatalf("crash of a: %v", err)
	}
	m, err := shard.New(shard.Config{Group: "g", Shards: g.shards, Store: newCalcStore(t, g), Identity: "a", TTL: ttl, PollInterval: poll})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := runMember(t, m)
	waitFor(t, 30*time.Second, "the restarted a owns every shard", func() bool { return r.running(t) && len(m.Owned()) == 4 })
	t.Logf("restarted member owns its shards after %v (TTL %v)", time.Since(start), ttl)

	dup, err := shard.New(shard.Config{Group: "g", Shards: g.shards, Store: newCalcStore(t, g), Identity: "a", TTL: ttl, PollInterval: poll})
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	err = dup.Run(context.Background(), func(ctx context.Context, s shard.Shard) { <-ctx.Done() })
	took := time.Since(start)
	if !errors.Is(err, shard.ErrIdentityInUse) {
		t.Fatalf("second live member with identity a: Run = %v, want ErrIdentityInUse", err)
	}
	t.Logf("duplicate refused after %v: %v", took, err)
	if took > 2*(ttl+poll)+10*time.Second {
		t.Errorf("duplicate refused after %v, bound 2 × (TTL + PollInterval) = %v", took, 2*(ttl+poll))
	}
	if n := len(m.Owned()); n != 4 {
		t.Errorf("the live member owns %d of 4 shards after the duplicate's attempt", n)
	}
}

// TestLeaveCause: when Run's ctx ends, every shard's Context ends with
// cause ErrLeft (which wraps context.Canceled); a shard given up because a
// member joined ends with ErrReassigned.
func TestLeaveCause(t *testing.T) {
	t.Parallel()
	g := newGroup(t, 2, 2*time.Second, 50*time.Millisecond)
	m, err := shard.New(shard.Config{Group: "g", Shards: g.shards, Store: newCalcStore(t, g), Identity: "z", TTL: 2 * time.Second, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r := runMember(t, m)
	waitFor(t, 30*time.Second, "z owns both shards", func() bool { return len(m.Owned()) == 2 })
	g.join("a")
	waitFor(t, 30*time.Second, "z gives one shard to a", func() bool { return len(m.Owned()) == 1 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.causes) != 2 {
		t.Fatalf("causes %v, want 2", r.causes)
	}
	if !errors.Is(r.causes[0], shard.ErrReassigned) {
		t.Errorf("cause on reassignment = %v, want ErrReassigned", r.causes[0])
	}
	if !errors.Is(r.causes[1], shard.ErrLeft) {
		t.Errorf("cause on leave = %v, want ErrLeft", r.causes[1])
	}
	for _, c := range r.causes {
		if !errors.Is(c, context.Canceled) {
			t.Errorf("cause %v does not wrap context.Canceled", c)
		}
	}
}
