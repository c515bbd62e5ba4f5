// Package failrun decides the level at which a failed call is logged, so
// that an outage is reported without flooding the log: the first failure
// of a run of failures is logged at Warn, the others at Debug, and the
// success that ends the run at Warn again, with the run's length and
// duration. Tries in a loop during an outage fail thousands of times a
// second; a user needs to hear that they fail, why, and when they stop
// failing — not each failure.
package failrun

import (
	"log/slog"
	"sync/atomic"
	"time"
)

// Run is the current run of failures of one kind of call (one Locker's
// acquires, one Store's renewals, …). The zero value is ready: no run.
// It is safe for concurrent use, and a success costs one atomic load when
// no run is under way.
type Run struct {
	n     atomic.Int64 // failures in the run under way; 0: none
	begin atomic.Int64 // when the run began, in Unix nanoseconds
}

// Fail records a failure at now and returns the level to log it at:
// [slog.LevelWarn] for the first of a run, [slog.LevelDebug] for the
// others.
func (r *Run) Fail(now time.Time) slog.Level {
	if r.n.Add(1) == 1 {
		r.begin.Store(now.UnixNano())
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

// Succeed records a success. When it ends a run, it returns the number of
// failures in the run, how long the run lasted until now (now is called
// only then), and true: the caller logs at Warn that the calls succeed
// again.
func (r *Run) Succeed(now func() time.Time) (failures int64, lasted time.Duration, ended bool) {
	if r.n.Load() == 0 {
		return 0, 0, false
	}
	begin := r.begin.Load()
	n := r.n.Swap(0)
	if n == 0 {
		return 0, 0, false // another success ended it
	}
	return n, now().Sub(time.Unix(0, begin)), true
}
