package shard

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

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

// view is one read of the group's rows: its live members and who owns
// which shard.
type view struct {
	members []string // identities of the live member rows, sorted
	// owners maps each held shard to its owner's identity, when that owner
	// is a live member and the shard is held by its current membership.
	// A shard held by anyone else — a member that died or left, a
	// membership that ended — is absent: free for the assignment.
	owners map[string]string
}

// readView reads the group's member rows and shard leases in one query
// (the held leases named "<Group>#…"), within TTL/3, and gives up at once
// if the member row is lost meanwhile: a read whose reply never comes (a
// lost packet, a half-open connection) must not keep the loop from
// noticing the loss or from reading again.
func (m *Member) readView(ctx context.Context, row *lease.Lease) (view, error) {
	rctx, cancel := context.WithTimeout(ctx, m.cfg.TTL/3)
	defer cancel()
	stop := context.AfterFunc(row.Context(), cancel)
	defer stop()
	infos, err := m.cfg.Store.ListPrefix(rctx, m.cfg.Group+"#")
	if err != nil {
		return view{}, fmt.Errorf("shard: read group %q: %w", m.cfg.Group, err)
	}
	return parseView(m.cfg.Group, infos), nil
}

// parseView makes a view of group's held leases. Group has no '#': a name
// "<group>#…" is this group's, and no other group's.
func parseView(group string, infos []lease.Info) view {
	rows := map[string]int64{}
	held := map[string]holder{}
	v := view{owners: map[string]string{}}
	for _, i := range infos {
		rest, ok := strings.CutPrefix(i.Name, group+"#")
		if !ok || !i.Held {
			continue
		}
		if id, ok := strings.CutPrefix(rest, "m:"); ok {
			rows[id] = i.Token
			v.members = append(v.members, id) // ListPrefix orders by name
		} else if s, ok := strings.CutPrefix(rest, "s:"); ok {
			var h holder
			// A lease without this metadata (taken by another version of
			// this package, or by hand) has no owner the rule knows of.
			if json.Unmarshal(i.Metadata, &h) == nil && h.Member != "" {
				held[s] = h
			}
		}
	}
	for s, h := range held {
		if tok, ok := rows[h.Member]; ok && tok == h.Row {
			v.owners[s] = h.Member
		}
	}
	return v
}

// target returns the shards that member self owns in the assignment of
// shards over members (sorted, no duplicates) when owners (shard →
// identity) own them now.
func target(shards []string, self string, members []string, owners map[string]string) []string {
	idx := make(map[string]int, len(members))
	for j, id := range members {
		idx[id] = j
	}
	me, ok := idx[self]
	if !ok {
		return nil
	}
	owner := make([]int, len(shards))
	for i, s := range shards {
		owner[i] = -1
		if id, ok := owners[s]; ok {
			if j, ok := idx[id]; ok {
				owner[i] = j
			}
		}
	}
	var out []string
	for i, j := range plan(shards, members, owner) {
		if j == me {
			out = append(out, shards[i])
		}
	}
	return out
}
