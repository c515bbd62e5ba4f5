package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/shard"
)

// shardStatus is the SHARDS part of status --json.
type shardStatus struct {
	Leases []struct{ Name string }
	Shards []struct {
		Group                    string
		Held, Free, Unattributed int
		Members                  []struct {
			Identity  string
			LastSeen  time.Time `json:"last_seen"`
			ExpiresIn int64     `json:"expires_in_ns"`
			PID       int
			Shards    *int
		}
		Shards []struct {
			Shard, Member, Owner string
			Held                 bool
			Token                int64
		}
	}
}

// shardMember runs a shard.Member of group on store until the test ends or
// the returned stop is called; stop waits for Run to return.
func shardMember(t *testing.T, store *lease.Store, group, id string, shards []string) (stop func()) {
	t.Helper()
	m, err := shard.New(shard.Config{Group: group, Shards: shards, Store: store, Identity: id,
		TTL: 3 * time.Second, PollInterval: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx, func(ctx context.Context, _ shard.Shard) { <-ctx.Done() }) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("member %s: Run: %v", id, err)
			}
		case <-time.After(time.Minute):
			t.Errorf("member %s: Run did not return", id)
		}
	}
	t.Cleanup(stop)
	return stop
}

// shardStore is a lease store on its own pool, recording pid as its
// process's, as the store of another process would.
func shardStore(t *testing.T, dsn string, pid int) *lease.Store {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	store, err := lease.New(pool, lease.Config{PID: pid, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = store.Close(context.Background())
		pool.Close()
	})
	return store
}

// waitShards runs status --json until ok accepts it.
func (c cli) waitShards(what string, ok func(shardStatus) bool) shardStatus {
	c.t.Helper()
	var st shardStatus
	var out string
	for deadline := time.Now().Add(time.Minute); ; {
		var errOut string
		var code int
		out, errOut, code = c.run("status", "--json")
		if code != 0 {
			c.t.Fatalf("status --json: %d %s", code, errOut)
		}
		st = shardStatus{}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			c.t.Fatalf("%v: %s", err, out)
		}
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("status never showed %s within a minute; last:\n%s", what, out)
		}
	}
}

// TestStatusShards runs a group of three members, each with the store of
// a process of its own, and a group of two members in one process:
// status lists each group's live members and how many shards each holds,
// each shard's owner under --shards or NAME, and the free shards once the
// members have left.
func TestStatusShards(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	if _, errOut, code := c.run("migrate"); code != 0 {
		t.Fatalf("migrate: %d %s", code, errOut)
	}
	var shards []string
	for i := range 30 {
		shards = append(shards, fmt.Sprintf("s%02d", i))
	}
	var stops []func()
	for i, id := range []string{"m1", "m2", "m3"} {
		stops = append(stops, shardMember(t, shardStore(t, c.dsn, 900001+i), "orders", id, shards))
	}
	shared := shardStore(t, c.dsn, 900100)
	shardMember(t, shared, "pair", "p1", []string{"a", "b", "c", "d"})
	shardMember(t, shared, "pair", "p2", []string{"a", "b", "c", "d"})
	// A shard lease of that process without a member's metadata, as an
	// older pglocks wrote them: it may be either member's.
	odd, err := shared.Acquire(context.Background(), "pair#s:e", 3*time.Second, lease.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}

	st := c.waitShards("3 members of orders with 10 shards each, and pair's 5 shards held, 2 by each member", func(st shardStatus) bool {
		if len(st.Shards) != 2 || st.Shards[0].Group != "orders" || st.Shards[1].Group != "pair" {
			return false
		}
		o, p := st.Shards[0], st.Shards[1]
		if o.Held != 30 || len(o.Members) != 3 || p.Held != 5 || len(p.Members) != 2 || p.Unattributed != 1 {
			return false
		}
		for _, m := range o.Members {
			if m.Shards == nil || *m.Shards != 10 {
				return false
			}
		}
		// p2 joins after p1 took all four: wait for p1 to hand it two.
		pairs := map[string]int{}
		for _, s := range p.Shards {
			pairs[s.Member]++
		}
		return pairs["p1"] == 2 && pairs["p2"] == 2
	})
	checkShardJSON(t, st)
	checkShardText(t, c)
	// Without the lease of no metadata, both members' counts are known.
	if err := odd.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.waitShards("pair's two members with 2 shards each", func(st shardStatus) bool {
		if len(st.Shards) != 2 {
			return false
		}
		p := st.Shards[1]
		return p.Held == 4 && p.Unattributed == 0 && p.Members[0].Shards != nil && *p.Members[0].Shards == 2 &&
			p.Members[1].Shards != nil && *p.Members[1].Shards == 2
	})

	// A member leaves: the others take its shards. All leave: every shard
	// is listed free.
	stops[2]()
	c.waitShards("orders' 30 shards held by m1 and m2", func(st shardStatus) bool {
		if len(st.Shards) == 0 {
			return false
		}
		o := st.Shards[0]
		return len(o.Members) == 2 && o.Held == 30 && o.Members[0].Shards != nil && *o.Members[0].Shards == 15
	})
	stops[0]()
	stops[1]()
	c.waitShards("orders with no member and 30 free shards", func(st shardStatus) bool {
		return len(st.Shards) > 0 && len(st.Shards[0].Members) == 0 && st.Shards[0].Held == 0 && st.Shards[0].Free == 30
	})
	out, _, _ := c.run("status")
	if !strings.Contains(out, "  group orders: 0 live members; 0 shards held, 30 free\n") ||
		!strings.Contains(out, "    free: s00, s01, s02, s03, s04, s05, s06, s07, s08, s09 and 20 more (--shards lists them)\n") {
		t.Errorf("status once orders' members left:\n%s", out)
	}
}

// checkShardJSON checks status --json while orders' 3 members hold 10
// shards each and pair's 2 members, in one process, hold 4, beside a
// lease of that process without a member's metadata.
func checkShardJSON(t *testing.T, st shardStatus) {
	t.Helper()
	o, p := st.Shards[0], st.Shards[1]
	for _, m := range o.Members {
		if m.LastSeen.IsZero() || m.ExpiresIn <= 0 || m.PID < 900001 || m.PID > 900003 {
			t.Errorf("member %+v", m)
		}
	}
	owners := map[string]int{}
	for _, s := range o.Shards {
		owners[s.Member]++
		if !s.Held || s.Token < 1 || s.Owner == "" {
			t.Errorf("shard %+v", s)
		}
	}
	if len(o.Shards) != 30 || owners["m1"] != 10 || owners["m2"] != 10 || owners["m3"] != 10 {
		t.Errorf("orders: %d shards, owners %v; want 30, 10 each of m1, m2, m3", len(o.Shards), owners)
	}
	// Two members in one process: each shard's metadata names its member;
	// the lease without it (e) is nobody's, and neither member's count
	// can be told.
	pairs := map[string]int{}
	for _, s := range p.Shards {
		pairs[s.Member]++
		if s.Shard == "e" && (s.Member != "" || s.Owner == "") {
			t.Errorf("pair's lease without metadata: %+v", s)
		}
	}
	if p.Unattributed != 1 || pairs["p1"] != 2 || pairs["p2"] != 2 || p.Members[0].Shards != nil || p.Members[1].Shards != nil {
		t.Errorf("pair: %+v (shards per member %v)", p, pairs)
	}
	for _, l := range st.Leases {
		if strings.Contains(l.Name, "#m:") || strings.Contains(l.Name, "#s:") {
			t.Errorf("lease %q listed under leases too", l.Name)
		}
	}
}

// checkShardText checks the text form while orders' 3 members hold 10
// shards each: a summary and the members, no shard list unless asked for.
func checkShardText(t *testing.T, c cli) {
	t.Helper()
	out, _, _ := c.run("status")
	t.Logf("status:\n%s", out)
	for _, want := range []string{"SHARDS\n", "  group orders: 3 live members; 30 shards held, 0 free\n",
		"    MEMBER  SHARDS  JOINED", "  group pair: 2 live members; 5 shards held, 0 free\n", "OWNER tells them apart"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q", want)
		}
	}
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 1 && (f[0] == "m1" || f[0] == "m2" || f[0] == "m3") && f[1] != "10" {
			t.Errorf("member line %q: want 10 shards", line)
		}
		if strings.Contains(line, "s07") || strings.Contains(line, "#s:") {
			t.Errorf("status without --shards lists a shard: %q", line)
		}
	}
	all, _, _ := c.run("status", "--shards")
	one, _, _ := c.run("status", "orders")
	for _, out := range []string{all, one} {
		if n := strings.Count(out, " held "); n < 30 {
			t.Errorf("%d shard lines held, want 30 or more:\n%s", n, out)
		}
		for line := range strings.Lines(out) {
			if strings.HasSuffix(strings.TrimSuffix(line, "\n"), " ") {
				t.Errorf("status line ends in spaces: %q", line)
			}
		}
	}
	if strings.Contains(one, "group pair") || !strings.Contains(one, "    SHARD  STATE  MEMBER  TOKEN  EXPIRES IN") {
		t.Errorf("status orders:\n%s", one)
	}
}

// TestStatusThousandShards (PGLOCKS_STRESS=1) measures status on a group
// of 1,000 shards over 10 members: the summary stays a few lines, and
// logs how long each form takes and how long it is.
func TestStatusThousandShards(t *testing.T) {
	if os.Getenv("PGLOCKS_STRESS") == "" {
		t.Skip("PGLOCKS_STRESS=1 runs it")
	}
	c := newCLI(t)
	if _, errOut, code := c.run("migrate"); code != 0 {
		t.Fatalf("migrate: %d %s", code, errOut)
	}
	shards := make([]string, 1000)
	for i := range shards {
		shards[i] = fmt.Sprintf("%04d", i)
	}
	for i := range 10 {
		shardMember(t, shardStore(t, c.dsn, 900001+i), "big", fmt.Sprintf("m%02d", i), shards)
	}
	start := time.Now()
	c.waitShards("1,000 shards held, 100 by each of 10 members", func(st shardStatus) bool {
		if len(st.Shards) != 1 || st.Shards[0].Held != 1000 || len(st.Shards[0].Members) != 10 {
			return false
		}
		for _, m := range st.Shards[0].Members {
			if m.Shards == nil || *m.Shards != 100 {
				return false
			}
		}
		return true
	})
	t.Logf("settled in %v", time.Since(start).Round(time.Millisecond))
	// The members' stores keep their interest in the shards they waited
	// for (shared advisory locks, listed under ADVISORY LOCKS) a second
	// after the wait.
	for deadline := time.Now().Add(30 * time.Second); ; {
		out, _, _ := c.run("status")
		if strings.Count(out, "\n") <= 40 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status still long 30s after the group settled:\n%s", out)
		}
	}
	for _, args := range [][]string{{"status"}, {"status", "--shards"}, {"status", "--json"}} {
		t0 := time.Now()
		out, errOut, code := c.run(args...)
		if code != 0 {
			t.Fatalf("%q: %d %s", args, code, errOut)
		}
		lines := strings.Count(out, "\n")
		t.Logf("pglocks %s: %v, %d lines, %d bytes", strings.Join(args, " "), time.Since(t0).Round(time.Millisecond), lines, len(out))
	}
}
