package shard_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// wantMoved returns how many shards the assignment moves when the group's
// running members become ids, from the settled ownership prev (shard →
// member) of one join or one leave, and the larger of the two member
// counts: a member joining takes ⌊N/M⌋ shards (M counting it), a member
// leaving or dying has its own shards moved, and no other shard moves
// (see the package doc, and TestPlanMovement and TestPlanConverges for
// the proof by simulation). Either is at most ⌈N/M⌉.
func wantMoved(n int, prev map[string]string, ids []string) (want, bigM int) {
	before := map[string]bool{}
	for _, m := range prev {
		before[m] = true
	}
	now := map[string]bool{}
	for _, id := range ids {
		now[id] = true
	}
	for _, m := range prev {
		if !now[m] {
			want++ // a leaver's shard
		}
	}
	if len(ids) > len(before) {
		want += n / len(ids) // the joiner's share
	}
	return want, max(len(before), len(ids))
}

// moveChecker checks the shards a live group moves per join or leave
// against the assignment's bound, and counts the acquisitions that moved
// them from the lease tokens (each acquisition raises its shard's token by
// one).
type moveChecker struct {
	t    *testing.T
	g    *group
	conn *pgx.Conn
	prev map[string]string // the last settled ownership
	tok  map[string]int64  // the group's lease tokens then, by lease name
}

// newMoveChecker starts from the settled ownership own.
func newMoveChecker(t *testing.T, g *group, own map[string]string) *moveChecker {
	c := &moveChecker{t: t, g: g, conn: g.db.Conn(t), prev: own}
	c.tok = c.tokens()
	return c
}

// tokens reads the token of every lease row of the group: shards and
// member rows.
func (c *moveChecker) tokens() map[string]int64 {
	rows, _ := c.conn.Query(context.Background(), `select name, token from pglocks_leases where starts_with(name, $1)`, c.g.name+"#")
	tok := map[string]int64{}
	var name string
	var token int64
	_, err := pgx.ForEachRow(rows, []any{&name, &token}, func() error {
		tok[name] = token
		return nil
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return tok
}

// step checks the settled ownership own after one join or one leave, ids
// being the running members now: loads within one, and exactly the moves
// of wantMoved, each by one acquisition — at most ⌈N/M⌉ and, for these
// tests' N and M, at most the promised 1.2 × N/M. A step during which
// leases were lost (more acquisitions than moves — a shard taken again by
// its owner or moved twice — or a running member's row taken again) is
// logged, not held to the bound: a lost lease is a fault, not a join or
// a leave, and its shard may go to another member (see the package doc).
func (c *moveChecker) step(what string, own map[string]string, ids []string) {
	t := c.t
	t.Helper()
	c.g.balanced(own)
	tok := c.tokens()
	moved := movedCount(c.prev, own)
	want, bigM := wantMoved(len(c.g.shards), c.prev, ids)
	taken, rejoined := 0, 0
	for s := range own {
		name := c.g.name + "#s:" + s
		taken += int(tok[name] - c.tok[name])
	}
	for _, id := range ids {
		name := c.g.name + "#m:" + id
		if old, ok := c.tok[name]; ok && tok[name] != old {
			rejoined++
		}
	}
	ratio := float64(moved) * float64(bigM) / float64(len(c.g.shards))
	t.Logf("%s: %d members, %d shards moved by %d acquisitions, %.2f × N/M (M = %d)", what, len(ids), moved, taken, ratio, bigM)
	switch {
	case taken > moved || rejoined > 0:
		t.Logf("%s: leases were lost meanwhile (%d acquisitions for %d moves, %d member rows taken again): not held to the bound", what, taken, moved, rejoined)
	case moved != want || ratio > 1.2:
		t.Fatalf("%s: %d shards moved (%.2f × N/M), the assignment moves %d", what, moved, ratio, want)
	}
	c.prev, c.tok = own, tok
}
