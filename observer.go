package pglocks

import "time"

// Observer receives the events of the advisory, lease and leader packages,
// for metrics: set it in their Config (Observer field). It has no
// dependency: package otelpglocks adapts it to OpenTelemetry, and any other
// metrics library can be wired the same way.
//
// Every field may be nil. The functions are called synchronously, on the
// goroutine where the event happens, sometimes with a lock of the reporting
// package held: they must be quick, must not block and must not call back
// into the package that reports. Package advisory is the exception: it
// holds none of its locks while it calls them, one at a time in order,
// from the goroutine of the call that caused the event or from one of its
// own, so that a function that blocks delays only other events (and the
// call that delivers them), never a session's pings. Events of one lock or
// lease are reported in order; events of different ones may be reported
// concurrently.
//
// What is guaranteed: each hold reported by Start is reported once by End,
// so Start − End is the number held now; Acquire is reported once per
// acquire call that got past input checks. Not guaranteed: that an event
// reaches the Observer before the caller sees the result.
type Observer struct {
	// Acquire is called when an acquire call returns (advisory TryLock,
	// Lock, TryRLock, RLock; lease TryAcquire, Acquire).
	Acquire func(AcquireEvent)
	// Start is called when a hold begins: a lock taken, a lease acquired
	// or resumed.
	Start func(HoldEvent)
	// End is called when a hold ends, with how long it lasted and why.
	End func(EndEvent)
	// Renew is called after each renewal of a lease (by Renew or by the
	// keep-alive) that reached the database or failed trying.
	Renew func(RenewEvent)
	// Leader is called when a candidate of an election becomes leader or
	// stops being leader.
	Leader func(LeaderEvent)
}

// Kind says which primitive an event is about.
type Kind string

// The kinds of hold.
const (
	KindAdvisory Kind = "advisory" // a session advisory lock (package advisory)
	KindLease    Kind = "lease"    // a lease row (package lease)
)

// Result is the outcome of an acquire call.
type Result string

// The results of an acquire call.
const (
	ResultAcquired Result = "acquired" // the lock or lease was taken
	ResultBusy     Result = "busy"     // held elsewhere (a try), or the wait ended first
	ResultError    Result = "error"    // any other failure
)

// Reason says why a hold ended. Only ReasonReleased and ReasonClosed are
// not losses.
type Reason string

// The reasons a hold ends.
const (
	// ReasonReleased: the holder unlocked or released it.
	ReasonReleased Reason = "released"
	// ReasonClosed: the Locker or Store was closed and released it (or,
	// for a lease, abandoned it to expire).
	ReasonClosed Reason = "closed"
	// ReasonSessionDied: the advisory lock's session died or stopped
	// answering (killed backend, network, restart, failover).
	ReasonSessionDied Reason = "session_died"
	// ReasonExpired: the lease was not renewed before its trust deadline.
	ReasonExpired Reason = "expired"
	// ReasonNotHeld: the server said the lease is no longer held by this
	// acquisition (taken over, broken).
	ReasonNotHeld Reason = "not_held"
	// ReasonUnknown: an operation's outcome is unknown (a reply was lost),
	// so the hold can no longer be trusted.
	ReasonUnknown Reason = "unknown_outcome"
	// ReasonMaxHold: the lease was held for its maximum hold
	// (lease.WithMaxHold) and ended, its row released.
	ReasonMaxHold Reason = "max_hold"
)

// Lost reports whether r is a loss: anything but released or closed.
func (r Reason) Lost() bool { return r != ReasonReleased && r != ReasonClosed }

// AcquireEvent is one acquire call's result.
type AcquireEvent struct {
	Kind   Kind
	Name   string // the key (Key.String) or lease name: high cardinality
	Shared bool   // a shared advisory lock (RLock)
	Wait   bool   // a waiting call (Lock, RLock, Acquire) rather than a try
	Result Result
	// Elapsed is how long the call took, on the monotonic clock.
	Elapsed time.Duration
	// Err is the call's error, nil when acquired.
	Err error
}

// HoldEvent is the start of a hold.
type HoldEvent struct {
	Kind  Kind
	Name  string
	Token int64 // a lease's fencing token; 0 for advisory locks
}

// EndEvent is the end of a hold.
type EndEvent struct {
	Kind   Kind
	Name   string
	Token  int64
	Reason Reason
	// Held is how long the hold lasted, on the monotonic clock.
	Held time.Duration
	// Err is why the hold ended when it was lost or closed, else nil.
	Err error
}

// RenewEvent is one renewal of a lease.
type RenewEvent struct {
	Kind    Kind
	Name    string
	Token   int64
	Latency time.Duration // how long the renewal took
	Err     error         // nil when renewed
}

// LeaderEvent is a change of leadership seen by one candidate.
type LeaderEvent struct {
	Election string // the election's name (low cardinality: one per election)
	Identity string // this candidate
	Leading  bool   // true: a term began; false: it ended
	Term     int64
	Reason   error // why the term ended, when Leading is false
}
