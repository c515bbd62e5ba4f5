package shard_test

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// procDDL makes the fenced writes' table (see procInsertSQL).
const procDDL = `create sequence proc_write_seq;
create table proc_writes (
	seq       bigint primary key,
	shard     text not null,
	token     bigint not null,
	member    text not null,
	owner     uuid not null,
	row_token bigint,
	row_owner uuid,
	row_left  interval,
	late      bool not null
)`

// procReport is the checker's finding over every committed fenced write.
type procReport struct {
	writes      int            // committed fenced writes
	late        int            // of which late writes (after the term's Context ended, the term still held)
	terms       int            // distinct (shard, token) that wrote
	shards      int            // shards written
	afterExpiry map[string]int // writer → its writes that committed after their row's expiry
	violations  []string
	more        int // violations not kept
}

func (r *procReport) violate(format string, args ...any) {
	if len(r.violations) < 20 {
		r.violations = append(r.violations, fmt.Sprintf(format, args...))
	} else {
		r.more++
	}
}

// procWrite is one committed fenced write.
type procWrite struct {
	seq, token      int64
	shard, member   string
	owner, rowOwner string
	rowToken        *int64
	rowLeft         float64 // seconds
	late            bool
}

// check is the checker, in the chaos suite's style: it judges the
// history — the committed writes — alone, whatever the members said.
// Per shard, in commit order (the seq each write took after its Guard: a
// later term's acquisition waits for an earlier term's guarded
// transaction, so writes of different terms are numbered as they
// committed), it proves:
//   - no write carries a token lower than one already written for the
//     shard: never two trusted owners;
//   - every write's term was the row's live term at that moment: the
//     lease row the write's transaction read, under the Guard's row lock
//     held to the commit, had the write's token and owner (not released);
//   - one token, one owner.
//
// A write whose row had expired by the time of its insert (its writer
// stalled between Guard and insert: a SIGSTOP) is no violation — the row
// stayed locked, so no other term began before it committed — but is
// counted, with its writer.
func (c *procCluster) check() procReport {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rows, err := c.admin.Query(ctx, `select seq, shard, token, member, owner::text, row_token,
	coalesce(row_owner::text, ''), coalesce(extract(epoch from row_left)::float8, 0), late
	from proc_writes order by shard, seq`)
	if err != nil {
		c.t.Fatalf("read the fenced writes: %v", err)
	}
	defer rows.Close()
	r := procReport{afterExpiry: map[string]int{}}
	var cur string
	var top procWrite // the write of the highest token so far in shard cur
	owners := map[int64]string{}
	for rows.Next() {
		var w procWrite
		if err := rows.Scan(&w.seq, &w.shard, &w.token, &w.member, &w.owner, &w.rowToken, &w.rowOwner, &w.rowLeft, &w.late); err != nil {
			c.t.Fatal(err)
		}
		if w.shard != cur {
			cur, top, owners = w.shard, w, map[int64]string{}
			r.shards++
		}
		r.add(w, &top, owners)
	}
	if err := rows.Err(); err != nil {
		c.t.Fatalf("read the fenced writes: %v", err)
	}
	return r
}

// add checks write w of a shard against the shard's history so far: top
// is the write of its highest token, owners each token's owner.
func (r *procReport) add(w procWrite, top *procWrite, owners map[int64]string) {
	r.writes++
	if w.late {
		r.late++
	}
	if w.token < top.token {
		r.violate("shard %s: write #%d by %s with token %d committed after #%d by %s with token %d",
			w.shard, w.seq, w.member, w.token, top.seq, top.member, top.token)
	} else {
		*top = w
	}
	if w.rowToken == nil || *w.rowToken != w.token || w.rowOwner != w.owner {
		row := "no row"
		if w.rowToken != nil {
			row = fmt.Sprintf("token %d, owner %q", *w.rowToken, w.rowOwner)
		}
		r.violate("shard %s: write #%d by %s (token %d) outside its term: the lease row had %s", w.shard, w.seq, w.member, w.token, row)
	}
	if o, ok := owners[w.token]; !ok {
		owners[w.token] = w.owner
		r.terms++
	} else if o != w.owner {
		r.violate("shard %s: token %d written by owners %s and %s", w.shard, w.token, o, w.owner)
	}
	if w.rowLeft <= 0 {
		r.afterExpiry[w.member]++
	}
}

func (r procReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d fenced writes (%d late writes of terms still held) by %d terms of %d shards; %d committed after their row's expiry, under the Guard's lock (by %v); %d violations",
		r.writes, r.late, r.terms, r.shards, sumValues(r.afterExpiry), r.afterExpiry, len(r.violations)+r.more)
	for _, v := range r.violations {
		fmt.Fprintf(&b, "\n  - %s", v)
	}
	if r.more > 0 {
		fmt.Fprintf(&b, "\n  - … and %d more", r.more)
	}
	return b.String()
}

func sumValues(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
