package lease_test

import (
	"context"
	"slices"
	"testing"
	"time"
)

// waitAcks waits for n acknowledged acquisitions.
func (w *tokenLog) waitAcks(t *testing.T, ctx context.Context, n int) {
	t.Helper()
	wait(t, ctx, "acquisitions before the fault", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.acks) >= n
	})
}

// waitAckAfter waits for an acquisition acknowledged after at.
func (w *tokenLog) waitAckAfter(t *testing.T, ctx context.Context, at time.Time) {
	t.Helper()
	wait(t, ctx, "an acquisition on the new primary", func() bool { return !w.firstAfter(at).IsZero() })
}

// firstAfter returns when the first acquisition after at was
// acknowledged, or the zero time.
func (w *tokenLog) firstAfter(at time.Time) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range w.acks {
		if a.at.After(at) {
			return a.at
		}
	}
	return time.Time{}
}

// outage returns the longest time without an acknowledged acquisition
// that ends after at — the failover as the workload saw it — by when the
// last acquisition before it and the first after it were acknowledged.
func (w *tokenLog) outage(at time.Time) (from, to time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := 1; i < len(w.acks); i++ {
		a, b := w.acks[i-1].at, w.acks[i].at
		if b.After(at) && b.Sub(a) > to.Sub(from) {
			from, to = a, b
		}
	}
	return from, to
}

// check counts the acknowledged tokens handed out again — one
// acknowledged twice, or one below a token acknowledged before it while
// its own lease was still trusted then (two holders of one name trusting
// their leases at once) — and fails t on any when strict. Acquisitions
// are judged in the order their calls returned, not the order they were
// recorded in: a lease acknowledged at the very end of its trust may
// expire, and the name be granted again, before its goroutine records it
// (seen once, token 46 recorded after 47, with 12 ms of trust left when
// its call returned). Such a late token is harmless, and counted apart.
func (w *tokenLog) check(t *testing.T, what string, strict bool) int {
	t.Helper()
	w.mu.Lock()
	acks := slices.Clone(w.acks)
	w.mu.Unlock()
	slices.SortStableFunc(acks, func(a, b tokenAck) int { return a.at.Compare(b.at) })
	seen := map[int64]bool{}
	var high tokenAck
	bad, late := 0, 0
	var first []int64
	for _, a := range acks {
		switch {
		case seen[a.token] || a.token < high.token && a.trusted.After(high.at):
			bad++
			if len(first) < 6 {
				first = append(first, a.token, high.token)
			}
		case a.token < high.token:
			late++
		}
		seen[a.token] = true
		if a.token > high.token {
			high = a
		}
	}
	if late > 0 {
		t.Logf("%s: %d acknowledged tokens below an earlier one, each no longer trusted when that one was acknowledged", what, late)
	}
	if bad > 0 {
		msg := "%s: %d of %d acknowledged tokens handed out again: acknowledged twice, or below an earlier one while still trusted (token, highest before: %v)"
		if strict {
			t.Errorf(msg, what, bad, len(acks), first)
		} else {
			t.Logf(msg, what, bad, len(acks), first)
		}
	}
	return bad
}

// highest returns the highest acknowledged token.
func (w *tokenLog) highest() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var h int64
	for _, a := range w.acks {
		h = max(h, a.token)
	}
	return h
}

func p50(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func maxOf(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return slices.Max(ds)
}

func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
