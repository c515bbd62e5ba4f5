package shard

import (
	"cmp"
	"hash/fnv"
	"slices"
)

// plan is the assignment rule: given the group's shards, its members and
// each shard's current owner (owner[i], an index into members, or -1 for
// a shard that is free or held by a non-member), it returns each shard's
// target member, indexed like shards (all -1 when there are no members).
// It is a function of the three alone (not of the order of shards or
// members), so members that read the same ownership compute the same
// target — and of last, if not nil: the member that last owned each shard
// (-1 if none is known), to which a free shard goes back first if it has
// room (see fill).
//
// With N shards and M members, every member has room for q = ⌊N/M⌋
// shards, and r = N mod M of them for q + 1 (see capacities). A member
// keeps as many of the shards it owns as it has room for, the heaviest by
// rendezvous weight first; the shards it drops, and the free ones, go to
// the members with room left, (shard, member) pairs heaviest first, as in
// rendezvous hashing with capacity. Every member ends with exactly its
// room, so loads differ by at most one, and a target applied is its own
// target again: the rule's fixpoint is reached in one step.
//
// Only what must move moves. From a balanced ownership, a member joining
// takes exactly ⌊N/M⌋ shards (M counting it) and no other shard moves; a
// member leaving has exactly its own shards (⌊N/M⌋ or ⌈N/M⌉, M counting
// it) spread over the others, and no other shard moves. Both are the
// least any balanced assignment can move (TestPlanMovement). Why, with
// q = ⌊N/M⌋ and r = N mod M after the change, and loads of q′ or q′ + 1
// before it:
//
//   - Join: the others own q′ ≥ q shards each. If q′ > q, all own more
//     than q and get room q or q + 1 ≤ q′: each drops its excess only,
//     and the rooms of the others add up to N − q, so the newcomer (the
//     one member owning nothing, never among the r) takes exactly q. If
//     q′ = q, the r′ members with q + 1 come first for the r = r′ − q
//     extra rooms; the others keep their q; r′ − r = q shards drop, all
//     to the newcomer.
//   - Leave: the leaver's shards are unowned; the others own q′ or
//     q′ + 1 ≤ q + 1. If q > q′ every room is at least q′ + 1; if q = q′,
//     at most r′ members own q + 1 and r = r′ + q′ ≥ r′ rooms of q + 1
//     go to them first. Nobody drops: only the leaver's shards move.
func plan(shards, members []string, owner, last []int) []int {
	n, m := len(shards), len(members)
	out := make([]int, n)
	for i := range out {
		out[i] = -1
	}
	if m == 0 {
		return out
	}
	sh := make([]uint64, n)
	for i, s := range shards {
		sh[i] = hash64(s)
	}
	mh := make([]uint64, m)
	for j, id := range members {
		mh[j] = mix(hash64(id))
	}
	owns := make([][]int, m)
	claim := make([]int, m) // owned, and free but last owned
	for i, j := range owner {
		if j >= 0 && j < m {
			owns[j] = append(owns[j], i)
			claim[j]++
		} else if last != nil && last[i] >= 0 && last[i] < m {
			claim[last[i]]++
		}
	}
	caps := capacities(n, members, mh, claim)
	room := make([]int, m)
	for j, own := range owns {
		if len(own) > caps[j] {
			// Keep the heaviest: the drops are the member's own choice,
			// and the same choice whoever computes it.
			slices.SortFunc(own, func(a, b int) int {
				if c := cmp.Compare(weight(sh[b], mh[j]), weight(sh[a], mh[j])); c != 0 {
					return c
				}
				return cmp.Compare(shards[a], shards[b])
			})
			own = own[:caps[j]]
		}
		for _, i := range own {
			out[i] = j
		}
		room[j] = caps[j] - len(own)
	}
	fill(out, last, shards, members, sh, mh, room)
	return out
}

// capacities returns each member's room: ⌊N/M⌋, and one more for N mod M
// of them. Those come first whose claim — the shards they own, and the
// free ones they owned last — is over ⌊N/M⌋, so that a balanced
// ownership keeps its shape, a member with one shard over the base never
// drops it while another member must take one more, and a member that
// lost a lease keeps its room for it; then the rest by a fixed
// pseudo-random priority of their identity. Which members get the one
// more does not change while shards move towards the target: a member
// over the base without it drops to the base (and its claim follows once
// the dropped shards are taken), and one below the base with it is ranked
// the same until it has grown past the base, after which it ranks first
// (TestPlanConverges).
func capacities(n int, members []string, mh []uint64, claim []int) []int {
	m := len(members)
	q, r := n/m, n%m
	caps := make([]int, m)
	order := make([]int, m)
	for j := range caps {
		caps[j] = q
		order[j] = j
	}
	if r == 0 {
		return caps
	}
	over := func(j int) bool { return claim[j] > q }
	slices.SortFunc(order, func(a, b int) int {
		if oa, ob := over(a), over(b); oa != ob {
			if oa {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(mix(mh[b]), mix(mh[a])); c != 0 {
			return c
		}
		return cmp.Compare(members[a], members[b])
	})
	for _, j := range order[:r] {
		caps[j]++
	}
	return caps
}

// fill gives every shard without a target (out[i] < 0) to a member with
// room left. First a shard goes back to the member that last owned it
// (last[i]), if that member has room: a shard whose lease its owner lost
// (renewals late) and is taking again is not given to another member
// meanwhile. Then (shard, member) pairs are taken by weight, heaviest
// first, each giving its shard to its member while the member has room.
// The rooms add up to the shards without a target, so every one gets one.
// Which free shard goes where never changes how many a member gets.
func fill(out, last []int, shards, members []string, sh, mh []uint64, room []int) {
	type pair struct {
		w    uint64
		s, m int32
	}
	var back, pairs []pair
	for i, j := range out {
		if j >= 0 {
			continue
		}
		if last != nil && last[i] >= 0 && last[i] < len(room) && room[last[i]] > 0 {
			back = append(back, pair{weight(sh[i], mh[last[i]]), int32(i), int32(last[i])})
		}
		for k, left := range room {
			if left > 0 {
				pairs = append(pairs, pair{weight(sh[i], mh[k]), int32(i), int32(k)})
			}
		}
	}
	byWeight := func(a, b pair) int {
		if c := cmp.Compare(b.w, a.w); c != 0 {
			return c
		}
		if c := cmp.Compare(shards[a.s], shards[b.s]); c != 0 {
			return c
		}
		return cmp.Compare(members[a.m], members[b.m])
	}
	slices.SortFunc(back, byWeight)
	slices.SortFunc(pairs, byWeight)
	for _, p := range append(back, pairs...) {
		if out[p.s] < 0 && room[p.m] > 0 {
			out[p.s] = int(p.m)
			room[p.m]--
		}
	}
}

// weight is the rendezvous weight of a (shard, member) pair from their
// hashes.
func weight(shard, member uint64) uint64 { return mix(shard ^ member) }

// hash64 is FNV-1a of s: stable across processes, versions and platforms.
func hash64(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// mix is SplitMix64's finalizer: it spreads FNV's weak low bits over the
// whole word, so weights of pairs that differ in one input look unrelated.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
