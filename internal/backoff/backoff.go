// Package backoff spaces out retries: capped exponential delays with full
// jitter, the one retry pacing every pglocks package uses.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Defaults for a zero Backoff: the first retry after up to 50 ms, then
// doubling to a cap of 1 s, so a retry loop makes at most ~2 attempts/s at
// steady state on average (full jitter halves the mean delay).
const (
	DefaultMin = 50 * time.Millisecond
	DefaultMax = time.Second
)

// Backoff yields the delays between attempts. The zero value is ready with
// the defaults. It is not safe for concurrent use.
type Backoff struct {
	Min, Max time.Duration // zero: DefaultMin, DefaultMax
	n        int
}

// Next returns the delay before the next attempt: a random duration in
// [d/2, d], where d = Min·2^k capped at Max, k the number of earlier calls.
// Keeping half the delay (not full jitter down to zero) bounds the rate at
// steady state to at most 2/Max attempts per second.
func (b *Backoff) Next() time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = DefaultMin
	}
	if hi <= 0 {
		hi = DefaultMax
	}
	d := lo
	for i := 0; i < b.n && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	b.n++
	return d/2 + rand.N(d/2+1)
}

// Reset starts the sequence again, after a success.
func (b *Backoff) Reset() { b.n = 0 }

// Wait sleeps for Next(), or until ctx ends; it returns ctx's cause then.
func (b *Backoff) Wait(ctx context.Context) error {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
