package shard

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// holder is the metadata of a shard's lease: which membership holds it.
// Row is the token of that membership's member row, so that a shard still
// held by an earlier membership of the same identity (a crashed process
// restarted with its pod name) is not counted as the new one's.
type holder struct {
	Member string `json:"member"`
	Row    int64  `json:"row"`
}

// holderMeta is the metadata of the shard leases a membership acquires.
func holderMeta(identity string, row int64) json.RawMessage {
	// A string and an int64 always marshal; the identity passed
	// pglocks.ValidateName (no NUL, valid UTF-8), so jsonb accepts it.
	b, _ := json.Marshal(holder{Member: identity, Row: row})
	return b
}

// view is one read of the group's rows: its live members and, for a read
// of the whole group, who owns which shard.
type view struct {
	members []string         // identities of the live member rows, sorted
	rows    map[string]int64 // their member rows' tokens
	// owners maps each held shard to its owner's identity, when that owner
	// is a live member and the shard is held by its current membership.
	// A shard held by anyone else — a member that died or left, a
	// membership that ended — is absent: free for the assignment.
	owners map[string]string
	// taken lists the shards whose lease is held, by anyone.
	taken map[string]bool
}

// rest is what a member remembers of its last read of the whole group,
// to read only the member rows while nothing changes.
type rest struct {
	settled bool             // that read found every shard with its target owner
	at      time.Time        // when
	gen     uint64           // the shard set's generation then
	rows    map[string]int64 // the member rows then
	target  []string         // this member's target then, sorted
}

// restReads is how many TTLs a member at rest goes without reading the
// whole group: a safety net, since at rest nothing the member rows do not
// show should change the target (a lost lease's shard is its owner's to
// take again).
const restReads = 10

// reconcile reads the group's rows — members and shard owners, in one
// query — and makes the running owners match this member's target. At
// rest — the last such read found every shard with its target owner, this
// member holds its target, its shard set is the same and the read is less
// than restReads TTLs old — it reads only the member rows, and the whole
// group only if they changed (a member joined, left, died or joined
// again). A failed read changes nothing.
func (m *Member) reconcile(ctx context.Context, row *lease.Lease, o *owners) {
	m.mu.Lock()
	shards, gen := m.shards, m.gen
	held := slices.Sorted(maps.Keys(m.held))
	m.mu.Unlock()
	r := &o.rest
	if r.settled && r.gen == gen && time.Since(r.at) < restReads*m.cfg.TTL && slices.Equal(held, r.target) {
		v, err := m.readView(ctx, row, m.cfg.Group+"#m:")
		if err != nil || maps.Equal(v.rows, r.rows) {
			m.readFailed(ctx, err)
			return
		}
	}
	readAt := time.Now()
	v, err := m.readView(ctx, row, m.cfg.Group+"#")
	readFor := time.Since(readAt)
	if err != nil {
		m.readFailed(ctx, err)
		return
	}
	// Our row is live (we hold its lease); if the read lacks it, it was
	// read before the server saw it, or it renewed late. Count ourselves in.
	members := memberSet(append(v.members, m.cfg.Identity))
	m.mu.Lock()
	m.seen = v.owners
	if m.last == nil {
		m.last = map[string]string{}
	}
	maps.Copy(m.last, v.owners)
	m.forgetStale(shards, v, readAt)
	owners := m.ownersLocked()
	last := maps.Clone(m.last)
	m.mu.Unlock()
	all := targets(shards, members, owners, last)
	var want []string
	wanted := make(map[string]bool)
	settled := true
	for i, id := range all {
		if id == m.cfg.Identity {
			want = append(want, shards[i])
			wanted[shards[i]] = true
		}
		if v.owners[shards[i]] != id {
			settled = false // a move to make, by this member or another
		}
	}
	o.set(want)
	m.cfg.Logger.Debug("shard: read the group", "group", m.cfg.Group, "member", m.cfg.Identity,
		"members", len(members), "read", readFor, "plan", time.Since(readAt)-readFor, "want", len(want), "settled", settled)
	m.mu.Lock()
	m.wanted = wanted
	m.mu.Unlock()
	slices.Sort(want)
	*r = rest{settled: settled, at: time.Now(), gen: gen, rows: v.rows, target: want}
}

// forgetStale forgets the last owner of every shard that the reads of v
// and before have found unowned for longer than TTL, from the read at now,
// unless that owner is this member and the shard's lease is free. The
// last owner is each member's own memory, not the group's: members that
// remember an unowned shard's last owner differently (one read it held,
// another never did) may each leave it to another, and nobody would take
// it. Past TTL the members plan the shard from the shared read. A member
// that remembers itself as the last owner of a free lease keeps that
// memory, so that the owner of a lost lease goes on taking it again
// however long that takes: its plan gives the shard back to it if it has
// room, and if it has none its plan is the others' (its claim changes
// no member's room). Of a lease held by a non-member it forgets itself
// too, or its claim to a shard it cannot take would stand while the
// others, having forgotten it, give it the room for another shard that
// it would not want. m.mu is held.
func (m *Member) forgetStale(shards []string, v view, now time.Time) {
	var free map[string]time.Time // the shards of the set read unowned, since when
	for _, s := range shards {
		if _, ok := v.owners[s]; ok {
			continue
		}
		since, ok := m.freeSince[s]
		if !ok {
			since = now
		}
		if free == nil {
			free = map[string]time.Time{}
		}
		free[s] = since
		if now.Sub(since) > m.cfg.TTL && (m.last[s] != m.cfg.Identity || v.taken[s]) {
			delete(m.last, s)
		}
	}
	m.freeSince = free
}

func (m *Member) readFailed(ctx context.Context, err error) {
	if err != nil && ctx.Err() == nil {
		m.cfg.Logger.Warn("shard: cannot read the group", "group", m.cfg.Group, "member", m.cfg.Identity, "err", err)
	}
}

// readView reads the held leases named prefix… — the group's member rows
// and shard leases, or its member rows only — within TTL/3, and gives up
// at once if the member row is lost meanwhile: a read whose reply never
// comes (a lost packet, a half-open connection) must not keep the loop
// from noticing the loss or from reading again.
func (m *Member) readView(ctx context.Context, row *lease.Lease, prefix string) (view, error) {
	rctx, cancel := context.WithTimeout(ctx, m.cfg.TTL/3)
	defer cancel()
	stop := context.AfterFunc(row.Context(), cancel)
	defer stop()
	infos, err := m.cfg.Store.ListPrefix(rctx, prefix)
	if err != nil {
		return view{}, fmt.Errorf("shard: read group %q: %w", m.cfg.Group, err)
	}
	return parseView(m.cfg.Group, infos), nil
}

// parseView makes a view of group's held leases. Group has no '#': a name
// "<group>#…" is this group's, and no other group's.
func parseView(group string, infos []lease.Info) view {
	held := map[string]holder{}
	v := view{rows: map[string]int64{}, owners: map[string]string{}, taken: map[string]bool{}}
	for _, i := range infos {
		rest, ok := strings.CutPrefix(i.Name, group+"#")
		if !ok || !i.Held {
			continue
		}
		if id, ok := strings.CutPrefix(rest, "m:"); ok {
			v.rows[id] = i.Token
			v.members = append(v.members, id) // ListPrefix orders by name
		} else if s, ok := strings.CutPrefix(rest, "s:"); ok {
			v.taken[s] = true
			var h holder
			// A lease without this metadata (taken by another version of
			// this package, or by hand) has no owner the rule knows of.
			if json.Unmarshal(i.Metadata, &h) == nil && h.Member != "" {
				held[s] = h
			}
		}
	}
	for s, h := range held {
		if tok, ok := v.rows[h.Member]; ok && tok == h.Row {
			v.owners[s] = h.Member
		}
	}
	return v
}

// targets returns each shard's target member in the assignment of shards
// over members (sorted, no duplicates) when owners (shard → identity) own
// them now and last owned them (see plan), indexed like shards ("" when
// there are no members).
func targets(shards, members []string, owners, last map[string]string) []string {
	idx := make(map[string]int, len(members))
	for j, id := range members {
		idx[id] = j
	}
	index := func(m map[string]string) []int {
		out := make([]int, len(shards))
		for i, s := range shards {
			out[i] = -1
			if id, ok := m[s]; ok {
				if j, ok := idx[id]; ok {
					out[i] = j
				}
			}
		}
		return out
	}
	out := make([]string, len(shards))
	for i, j := range plan(shards, members, index(owners), index(last)) {
		if j >= 0 {
			out[i] = members[j]
		}
	}
	return out
}

// target returns the shards that member self owns in targets.
func target(shards []string, self string, members []string, owners, last map[string]string) []string {
	if !slices.Contains(members, self) {
		return nil
	}
	var out []string
	for i, id := range targets(shards, members, owners, last) {
		if id == self {
			out = append(out, shards[i])
		}
	}
	return out
}
