package shard_test

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// traceLine is one Debug line of a member process (slog's text format):
// who, when (its own clock: the processes share the machine's), what.
type traceLine struct {
	id    string
	at    time.Time
	msg   string
	attrs map[string]string
}

// traceAttr finds slog's key=value and key="quoted value" pairs.
var traceAttr = regexp.MustCompile(`(\w+)=(?:"((?:[^"\\]|\\.)*)"|(\S*))`)

// traceMsgs are the messages the breakdown uses; the test keeps no other.
var traceMsgs = []string{`msg="shard: read the group"`, `msg=pool `, `msg="shard: acquired"`, `msg="shard: cannot read the group"`}

// parseTrace parses a member's line if its message is one of traceMsgs.
func parseTrace(id, line string) (traceLine, bool) {
	if !slices.ContainsFunc(traceMsgs, func(m string) bool { return strings.Contains(line, m) }) {
		return traceLine{}, false
	}
	tl := traceLine{id: id, attrs: map[string]string{}}
	for _, m := range traceAttr.FindAllStringSubmatch(line, -1) {
		tl.attrs[m[1]] = m[2] + m[3]
	}
	at, err := time.Parse(time.RFC3339Nano, tl.attrs["time"])
	if err != nil {
		return traceLine{}, false
	}
	tl.at, tl.msg = at, tl.attrs["msg"]
	return tl, true
}

// killSnap is the victim's rows right after a SIGKILL, by the server.
type killSnap struct {
	t0                 time.Time     // the kill, by the parent's clock
	now                time.Time     // the server's clock when read
	off                time.Duration // the parent's clock minus the server's, about
	rowExp             time.Time     // the member row's expiry
	rowRenewed         time.Time
	shardMin, shardMax time.Time // the earliest and latest expiry of its shard leases
	shards             int
}

// snapKill reads victim's rows: the member row's expiry and its shard
// leases' (the stores record the identity as the rows' hostname).
func (c *procCluster) snapKill(victim string, t0 time.Time) killSnap {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := killSnap{t0: t0}
	q0 := time.Now()
	rows, err := c.admin.Query(ctx, `select name, expires_at, renewed_at, clock_timestamp() from pglocks_leases
where hostname = $1 and owner is not null and name like $2`, victim, procGroup+"#%")
	if err != nil {
		c.t.Fatalf("read the victim's rows: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var exp, ren time.Time
		if err := rows.Scan(&name, &exp, &ren, &k.now); err != nil {
			c.t.Fatal(err)
		}
		if strings.HasPrefix(name, procGroup+"#m:") {
			k.rowExp, k.rowRenewed = exp, ren
			continue
		}
		k.shards++
		if k.shardMin.IsZero() || exp.Before(k.shardMin) {
			k.shardMin = exp
		}
		k.shardMax = later(k.shardMax, exp)
	}
	if err := rows.Err(); err != nil {
		c.t.Fatal(err)
	}
	if !k.now.IsZero() {
		q1 := time.Now()
		k.off = q0.Add(q1.Sub(q0) / 2).Sub(k.now)
	}
	return k
}

// local is a server time ts by the parent's clock.
func (k killSnap) local(ts time.Time) time.Time {
	if ts.IsZero() {
		return ts
	}
	return ts.Add(k.off)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// breakdown logs where the time of a takeover after SIGKILL went: the
// victim's rows' expiry, each survivor's first read of the group without
// it (its duration, the plan's), and the acquisitions of its shards (the
// rows' acquired_at, by the server), against took, the test's own view of
// it. It returns the takeover by the server's clock: from the kill to the
// last of the victim's shards acquired by another member.
func (c *procCluster) breakdown(what string, k killSnap, victim string, before map[string]string, took time.Duration) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var names []string
	for s, id := range before {
		if id == victim {
			names = append(names, procGroup+"#s:"+s)
		}
	}
	var first, last time.Time
	rows, err := c.admin.Query(ctx, `select acquired_at from pglocks_leases where name = any($1)`, names)
	if err != nil {
		c.t.Fatalf("read the taken shards: %v", err)
	}
	for rows.Next() {
		var at time.Time
		if err := rows.Scan(&at); err != nil {
			c.t.Fatal(err)
		}
		if first.IsZero() || at.Before(first) {
			first = at
		}
		last = later(last, at)
	}
	rows.Close()
	rel := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.Sub(k.t0).Round(time.Millisecond).String()
	}
	// The server's times, by the parent's clock (the members' share it).
	k.now, k.rowRenewed, k.rowExp = k.local(k.now), k.local(k.rowRenewed), k.local(k.rowExp)
	k.shardMin, k.shardMax, first, last = k.local(k.shardMin), k.local(k.shardMax), k.local(first), k.local(last)
	c.t.Logf("%s: breakdown from the kill: snapshot read at %s; member row renewed %s, expires %s; its %d shard leases expire %s..%s; acquired (server) %s..%s; seen taken by the test %s",
		what, rel(k.now), rel(k.rowRenewed), rel(k.rowExp), k.shards, rel(k.shardMin), rel(k.shardMax), rel(first), rel(last), took.Round(time.Millisecond))
	c.mu.Lock()
	trace := slices.Clone(c.trace)
	c.mu.Unlock()
	seen := map[string]bool{}
	var reads, failed []string
	type poolUse struct {
		n, max, of int
		w0, w1     int64
	}
	pools := map[string]poolUse{}
	acq := map[string][2]time.Time{}
	for _, tl := range trace {
		if !tl.at.After(k.t0) || tl.id == victim {
			continue
		}
		switch tl.msg {
		case "shard: read the group":
			// the first whole read after the kill whose plan moved something
			if n, _ := strconv.Atoi(tl.attrs["members"]); !seen[tl.id] && n < len(c.live())+1 {
				seen[tl.id] = true
				reads = append(reads, fmt.Sprintf("%s at %s (read %s, plan %s, want %s)", tl.id, rel(tl.at), tl.attrs["read"], tl.attrs["plan"], tl.attrs["want"]))
			}
		case "pool":
			if tl.at.After(k.rowExp) && tl.at.Before(k.t0.Add(took)) {
				n, _ := strconv.Atoi(tl.attrs["acquired"])
				w, _ := strconv.ParseInt(tl.attrs["waited_ms"], 10, 64)
				p := pools[tl.id]
				if p.n == 0 {
					p.w0 = w
				}
				p.of, _ = strconv.Atoi(tl.attrs["max"])
				p.n, p.max, p.w1 = p.n+1, max(p.max, n), w
				pools[tl.id] = p
			}
		case "shard: cannot read the group":
			if tl.at.Before(k.t0.Add(took)) {
				failed = append(failed, fmt.Sprintf("%s at %s (%s)", tl.id, rel(tl.at), tl.attrs["err"]))
			}
		case "shard: acquired":
			if !slices.Contains(names, procGroup+"#s:"+tl.attrs["shard"]) {
				continue
			}
			a := acq[tl.id]
			if a[0].IsZero() {
				a[0] = tl.at
			}
			a[1] = later(a[1], tl.at)
			acq[tl.id] = a
		}
	}
	c.t.Logf("%s: first reads without the victim: %s", what, strings.Join(reads, "; "))
	var ps []string
	for _, id := range slices.Sorted(maps.Keys(pools)) {
		p := pools[id]
		ps = append(ps, fmt.Sprintf("%s %d/%d, waited %d ms", id, p.max, p.of, p.w1-p.w0))
	}
	c.t.Logf("%s: Stores' pools from the row's expiry to the takeover (most in use; time acquisitions waited): %s", what, strings.Join(ps, "; "))
	if len(failed) > 0 {
		c.t.Logf("%s: failed reads before the takeover: %s", what, strings.Join(failed, "; "))
	}
	var got []string
	for _, id := range slices.Sorted(maps.Keys(acq)) {
		got = append(got, fmt.Sprintf("%s %s..%s", id, rel(acq[id][0]), rel(acq[id][1])))
	}
	c.t.Logf("%s: acquired (members' clocks): %s", what, strings.Join(got, "; "))
	return last.Sub(k.t0)
}
