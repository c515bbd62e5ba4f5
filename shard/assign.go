package shard

import (
	"cmp"
	"hash/fnv"
	"slices"
)

// assign spreads shards over members and returns each shard's member,
// indexed like shards. It is a function of the two sets alone (not of their
// order), so every member computes the same assignment from the same view.
//
// Each (shard, member) pair has a pseudo-random weight, as in rendezvous
// (highest-random-weight) hashing. Pairs are taken by weight, heaviest
// first; a pair is used when its shard has no member yet and its member has
// room. Every member has room for ⌊N/M⌋ shards, and the first N mod M
// members to fill up get one more: so max − min ≤ 1. Taking the heaviest
// pairs first is the stable matching of shards and members that both rank
// each other by weight, which moves few shards when a member joins or
// leaves: mostly those the newcomer outweighs, or those of the leaver.
func assign(shards, members []string) []int {
	n, m := len(shards), len(members)
	owner := make([]int, n)
	for i := range owner {
		owner[i] = -1
	}
	if m == 0 {
		return owner
	}
	type pair struct {
		w    uint64
		s, m int32
	}
	sh := make([]uint64, n)
	for i, s := range shards {
		sh[i] = hash64(s)
	}
	mh := make([]uint64, m)
	for j, id := range members {
		mh[j] = mix(hash64(id))
	}
	pairs := make([]pair, 0, n*m)
	for i := range shards {
		for j := range members {
			pairs = append(pairs, pair{mix(sh[i] ^ mh[j]), int32(i), int32(j)})
		}
	}
	slices.SortFunc(pairs, func(a, b pair) int {
		if c := cmp.Compare(b.w, a.w); c != 0 {
			return c
		}
		if c := cmp.Compare(shards[a.s], shards[b.s]); c != 0 {
			return c
		}
		return cmp.Compare(members[a.m], members[b.m])
	})
	q, extra := n/m, n%m
	load := make([]int, m)
	left := n
	for _, p := range pairs {
		if left == 0 {
			break
		}
		if owner[p.s] >= 0 || load[p.m] > q || (load[p.m] == q && extra == 0) {
			continue
		}
		if load[p.m] == q {
			extra--
		}
		owner[p.s] = int(p.m)
		load[p.m]++
		left--
	}
	return owner
}

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
