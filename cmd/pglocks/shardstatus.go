package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
)

// A group of package shard is a set of lease rows: "G#m:ID", the member
// row of member ID, held while the member runs, and "G#s:SHARD", the lease
// of shard SHARD, held by the member that owns it. A group name has no
// '#'. Rows are never deleted: a member that left and a shard nobody owns
// keep a free row.

// shardGroup is one group of package shard: its live members and its
// shards, as their rows show them.
type shardGroup struct {
	Group string `json:"group"`
	// Members are the live members: their member rows are held.
	Members []shardMember `json:"members"`
	// Held and Free count the shards whose lease is held, and those whose
	// row is free (released, broken or expired).
	Held int `json:"held"`
	Free int `json:"free"`
	// Unattributed counts the held shards that name no live member (see
	// shardRow.Member).
	Unattributed int `json:"unattributed"`
	// Shards are every shard with a row, by name. A shard never owned has
	// none and is not listed.
	Shards []shardRow `json:"shards"`
}

// shardMember is one live member of a group.
type shardMember struct {
	Identity string    `json:"identity"`
	JoinedAt time.Time `json:"joined_at"`
	// LastSeen is when its row was last renewed, and ExpiresIn the time it
	// has left, by the server clock.
	LastSeen  time.Time     `json:"last_seen"`
	ExpiresIn time.Duration `json:"expires_in_ns"`
	Host      string        `json:"hostname,omitempty"`
	PID       int           `json:"pid,omitempty"`
	// Shards counts the shards it holds; null when some held shard may be
	// its but names no member (see shardRow.Member).
	Shards *int `json:"shards"`

	token int64 // its member row's token
}

// shardRow is one shard of a group.
type shardRow struct {
	Shard string `json:"shard"`
	Held  bool   `json:"held"`
	// Member is the identity of the live member that holds it: the one
	// the lease's metadata names, with the token of that member's current
	// row. A lease without that metadata (written by an older pglocks)
	// goes to the only live member of the group whose row was written by
	// the same process (host and pid). Empty when no live member can be
	// named; Owner then says who holds it.
	Member    string        `json:"member,omitempty"`
	Owner     string        `json:"owner,omitempty"`
	Token     int64         `json:"token"`
	ExpiresIn time.Duration `json:"expires_in_ns"`
	Host      string        `json:"hostname,omitempty"`
	PID       int           `json:"pid,omitempty"`

	meta    shardHolder // the lease's metadata, if it has a member's
	foreign bool        // metadata of another shape: it names no member
}

// shardHolder is the metadata package shard writes on a shard's lease: the
// identity of the member holding it and its member row's token.
type shardHolder struct {
	Member string `json:"member"`
	Row    int64  `json:"row"`
}

// shardRows are the groups' rows read from the lease table: every member
// and shard row, held or not (Store.List lists only the held ones).
type shardRows struct {
	groups map[string]*shardGroup
	tokens map[string]int64 // shard lease name → token, for the free ones
}

// shardRowsSQL reads the names and tokens of the rows that may belong to
// a group: the table has no index for it, so it reads every row, as
// Store.ListPrefix does.
const shardRowsSQL = `select name, token from %s where strpos(name, '#m:') > 0 or strpos(name, '#s:') > 0`

// groupRow splits a lease name into a group, a kind ('m' member, 's'
// shard) and the rest, if it has the form of a group's row.
func groupRow(name string) (group string, kind byte, rest string, ok bool) {
	if strings.HasPrefix(name, leaderPrefix) {
		return "", 0, "", false // an election's rows
	}
	g, r, found := strings.Cut(name, "#")
	if !found || g == "" || len(r) < 2 || r[1] != ':' || (r[0] != 'm' && r[0] != 's') {
		return "", 0, "", false
	}
	return g, r[0], r[2:], true
}

// readShardRows reads the names of the groups' rows, so that free shards
// are listed: a group is a name with a member row ("G#m:…"), held or not.
// Called before Store.List, so that a row made in between is held there.
func readShardRows(ctx context.Context, pool *pgxpool.Pool, t tables) (shardRows, error) {
	sr := shardRows{groups: map[string]*shardGroup{}, tokens: map[string]int64{}}
	rows, _ := pool.Query(ctx, fmt.Sprintf(shardRowsSQL, pgx.Identifier{t.schema, t.table}.Sanitize()))
	type nameToken struct {
		name  string
		token int64
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (nameToken, error) {
		var nt nameToken
		return nt, r.Scan(&nt.name, &nt.token)
	})
	if err != nil {
		return sr, err
	}
	for _, nt := range all {
		if g, kind, _, ok := groupRow(nt.name); ok {
			if kind == 'm' {
				sr.addGroup(g)
			} else {
				sr.tokens[nt.name] = nt.token
			}
		}
	}
	return sr, nil
}

func (sr *shardRows) addGroup(g string) {
	if sr.groups[g] == nil {
		sr.groups[g] = &shardGroup{Group: g, Members: []shardMember{}, Shards: []shardRow{}}
	}
}

// addShards sorts the held rows of infos into the groups: member rows of
// any group (a member that joined after readShardRows makes its group),
// shard rows of groups that have member rows. It returns the rows left,
// among them the rows of groups other than name, if set (a shard's own
// lease name given as NAME shows under LEASES).
func (sr *shardRows) addShards(infos []lease.Info, name string) []lease.Info {
	for _, in := range infos {
		if g, kind, _, ok := groupRow(in.Name); ok && kind == 'm' {
			sr.addGroup(g)
		}
	}
	var rest []lease.Info
	for _, in := range infos {
		g, kind, id, ok := groupRow(in.Name)
		if !ok || sr.groups[g] == nil || name != "" && g != name {
			rest = append(rest, in)
			continue
		}
		grp := sr.groups[g]
		if kind == 'm' {
			grp.Members = append(grp.Members, shardMember{Identity: id, JoinedAt: in.AcquiredAt,
				LastSeen: in.RenewedAt, ExpiresIn: in.TimeLeft, Host: in.Hostname, PID: in.PID, token: in.Token})
			continue
		}
		delete(sr.tokens, in.Name)
		row := shardRow{Shard: id, Held: true, Owner: in.Owner.String(),
			Token: in.Token, ExpiresIn: in.TimeLeft, Host: in.Hostname, PID: in.PID}
		if len(in.Metadata) > 0 && json.Unmarshal(in.Metadata, &row.meta) != nil {
			row.meta, row.foreign = shardHolder{}, true // as package shard reads it: no member's
		}
		grp.Shards = append(grp.Shards, row)
	}
	for row, token := range sr.tokens {
		g, _, id, _ := groupRow(row)
		if grp := sr.groups[g]; grp != nil {
			grp.Shards = append(grp.Shards, shardRow{Shard: id, Token: token})
		}
	}
	return rest
}

// list returns the groups (only group name if set), by name, each with
// its shards attributed to its members.
func (sr *shardRows) list(name string) []shardGroup {
	out := []shardGroup{}
	for _, g := range sr.groups {
		if name == "" || g.Group == name {
			g.attribute()
			out = append(out, *g)
		}
	}
	slices.SortFunc(out, func(a, b shardGroup) int { return strings.Compare(a.Group, b.Group) })
	return out
}

// attribute counts the group's held and free shards and gives each held
// one to the live member its metadata names (that member's current row),
// or else to the live member that runs in its process, if exactly one
// does.
func (g *shardGroup) attribute() {
	type proc struct {
		host string
		pid  int
	}
	byProc := map[proc][]int{} // process → indexes of its members
	byRow := map[shardHolder]int{}
	for i, m := range g.Members {
		p := proc{m.Host, m.PID}
		byProc[p] = append(byProc[p], i)
		byRow[shardHolder{m.Identity, m.token}] = i
	}
	counts := make([]int, len(g.Members))
	unknown := map[proc]bool{} // processes with a held shard no member is named for
	for i := range g.Shards {
		s := &g.Shards[i]
		if !s.Held {
			g.Free++
			continue
		}
		g.Held++
		if m, ok := byRow[s.meta]; ok {
			s.Member = g.Members[m].Identity
			counts[m]++
		} else if ms := byProc[proc{s.Host, s.PID}]; s.meta.Member == "" && !s.foreign && len(ms) == 1 {
			s.Member = g.Members[ms[0]].Identity
			counts[ms[0]]++
		} else {
			g.Unattributed++
			// A lease naming a member's earlier row is no live member's;
			// one naming none may be any of its process's members'.
			unknown[proc{s.Host, s.PID}] = unknown[proc{s.Host, s.PID}] || s.meta.Member == ""
		}
	}
	for i := range g.Members {
		if !unknown[proc{g.Members[i].Host, g.Members[i].PID}] {
			g.Members[i].Shards = &counts[i]
		}
	}
	slices.SortFunc(g.Members, func(a, b shardMember) int { return strings.Compare(a.Identity, b.Identity) })
	slices.SortFunc(g.Shards, func(a, b shardRow) int { return strings.Compare(a.Shard, b.Shard) })
}

// freeShown is how many free shards a group's summary names.
const freeShown = 10

// printShards prints the SHARDS section: per group a summary line and its
// live members, and its shards one a line if all is set.
func printShards(tw *tabwriter.Writer, groups []shardGroup, all bool) {
	fmt.Fprintln(tw, "SHARDS")
	if len(groups) == 0 {
		fmt.Fprintln(tw, "  (none)")
	}
	for _, g := range groups {
		fmt.Fprintf(tw, "  group %s: %d live members; %d shards held, %d free\n", g.Group, len(g.Members), g.Held, g.Free)
		if len(g.Members) > 0 {
			fmt.Fprintln(tw, "    MEMBER\tSHARDS\tJOINED\tLAST SEEN\tEXPIRES IN\tHOST\tPID")
		}
		for _, m := range g.Members {
			n := "?"
			if m.Shards != nil {
				n = strconv.Itoa(*m.Shards)
			}
			fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t%s\t%s\t%d\n", m.Identity, n, m.JoinedAt.Format(time.RFC3339),
				m.LastSeen.Format(time.RFC3339Nano), m.ExpiresIn.Round(time.Millisecond), m.Host, m.PID)
		}
		if g.Unattributed > 0 {
			fmt.Fprintf(tw, "    %d held shards name no live member of the group (its member row lost or left, or a lease without a member's metadata in a process with several members): OWNER tells them apart\n", g.Unattributed)
		}
		if all {
			printShardList(tw, g)
		} else if g.Free > 0 {
			fmt.Fprintf(tw, "    free: %s\n", freeNames(g))
		}
	}
}

// printShardList prints each shard of g on a line, in columns of their
// own (not the members').
func printShardList(tw *tabwriter.Writer, g shardGroup) {
	if len(g.Shards) == 0 {
		return
	}
	_ = tw.Flush()
	fmt.Fprintln(tw, "    SHARD\tSTATE\tMEMBER\tTOKEN\tEXPIRES IN\tOWNER")
	for _, s := range g.Shards {
		owner := s.Owner
		if s.Member != "" || !s.Held {
			owner = ""
		}
		fmt.Fprintf(tw, "    %s\t%s\t%s\t%d\t%s\t%s\n", s.Shard, heldWord(s.Held), s.Member, s.Token,
			s.ExpiresIn.Round(time.Millisecond), owner)
	}
}

// freeNames names the first freeShown free shards of g, and counts the
// others.
func freeNames(g shardGroup) string {
	var names []string
	for _, s := range g.Shards {
		if !s.Held {
			names = append(names, s.Shard)
		}
	}
	if len(names) <= freeShown {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:freeShown], ", ") + fmt.Sprintf(" and %d more (--shards lists them)", len(names)-freeShown)
}
