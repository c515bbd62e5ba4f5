package shard

import (
	"fmt"
	"math"
	"slices"
	"testing"
)

func names(prefix string, n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return s
}

// ownersOf maps shard name to member name.
func ownersOf(shards, members []string) map[string]string {
	o := map[string]string{}
	for i, j := range assign(shards, members) {
		o[shards[i]] = members[j]
	}
	return o
}

func moved(a, b map[string]string) int {
	n := 0
	for s, m := range a {
		if b[s] != m {
			n++
		}
	}
	return n
}

// TestAssignBalanced: every shard has a member, loads differ by at most
// one, and the result does not depend on the order of either set.
func TestAssignBalanced(t *testing.T) {
	for _, n := range []int{1, 7, 100, 1000} {
		for _, m := range []int{1, 2, 3, 5, 10, 13} {
			shards, members := names("s", n), names("m", m)
			a := ownersOf(shards, members)
			load := map[string]int{}
			for _, mm := range a {
				load[mm]++
			}
			lo, hi := math.MaxInt, 0
			for _, id := range members {
				lo, hi = min(lo, load[id]), max(hi, load[id])
			}
			if len(a) != n || hi-lo > 1 {
				t.Fatalf("N=%d M=%d: %d assigned, loads %d..%d", n, m, len(a), lo, hi)
			}
			rs, rm := slices.Clone(shards), slices.Clone(members)
			slices.Reverse(rs)
			slices.Reverse(rm)
			if d := moved(a, ownersOf(rs, rm)); d != 0 {
				t.Fatalf("N=%d M=%d: order changed %d owners", n, m, d)
			}
		}
	}
}

// TestAssignMovement measures the shards moved when one member joins or
// leaves, over 20 member sets, as a multiple of N/M (M the larger set).
// The sets are fixed, so the figures are too; pinned at what the scheme
// does (a regression guard, not the ideal of 1.0), as docs/shards.md and
// the package doc state them: N = 100, M ≤ 6: mean ≤ 1.25, worst ≤ 1.45
// (measured 1.23, 1.44); N = 100, M ≤ 11: mean ≤ 1.6, worst ≤ 2.0
// (1.56, 1.98); N = 1,000, M ≤ 10: mean ≤ 1.2, worst ≤ 1.3 (1.18, 1.25).
func TestAssignMovement(t *testing.T) {
	for _, n := range []int{100, 1000} {
		for m := 1; m <= 10; m++ {
			if n == 1000 && m%3 != 0 {
				continue
			}
			var sum, worst float64
			const trials = 20
			for trial := range trials {
				shards := names("", n)
				members := names(fmt.Sprintf("t%d-", trial), m+1)
				a, b := ownersOf(shards, members[:m]), ownersOf(shards, members)
				r := float64(moved(a, b)) / (float64(n) / float64(m+1))
				sum += r
				worst = max(worst, r)
			}
			mean := sum / trials
			t.Logf("N=%d M=%d↔%d: moved/(N/M) mean %.3f worst %.3f", n, m, m+1, mean, worst)
			meanMax, worstMax := 1.25, 1.45
			switch {
			case n == 1000:
				meanMax, worstMax = 1.2, 1.3
			case m > 5:
				meanMax, worstMax = 1.6, 2.0
			}
			if mean > meanMax || worst > worstMax {
				t.Errorf("N=%d M=%d↔%d: moved/(N/M) mean %.3f worst %.3f", n, m, m+1, mean, worst)
			}
		}
	}
}
