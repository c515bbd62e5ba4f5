package leader

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/lease"
)

// Term is one leadership of one candidate: from its election to its
// demotion. Terms of an election are numbered by the lease's fencing token,
// so a later term always has a higher Number, across crashes and server
// restarts.
type Term struct {
	// Election is the election's name.
	Election string
	// Number is the term number: the lease's fencing token.
	Number int64
	// Identity is the leader's identity.
	Identity string
	// Since is when this candidate was elected, by its local clock.
	Since time.Time

	lease *lease.Lease
	lock  *advisory.Lock
	grace time.Duration
	now   func() time.Time // the Store's clock: the one lease deadlines are read on
	ctx   context.Context  // cancelled when the term ends, for any reason
	lapse *lapse           // set once a passed trust deadline was read
	pub   *publisher       // the term's published value (see Proclaim)
}

// lapse records that a term's trust deadline was read as passed. From then
// on the term is over, whatever a renewal or session check answered later
// says: a leader that read the lapse has stopped trusting its term, and
// its elector steps down (see Elector.watch).
type lapse struct {
	once sync.Once
	ch   chan struct{}
	at   time.Time // the passed deadline read first; set before ch closes
}

func newLapse() *lapse { return &lapse{ch: make(chan struct{})} }

func (l *lapse) mark(until time.Time) {
	if l != nil {
		l.once.Do(func() { l.at = until; close(l.ch) })
	}
}

// done is closed once a lapse was read; nil (never ready) for no lapse.
func (l *lapse) done() <-chan struct{} {
	if l == nil {
		return nil
	}
	return l.ch
}

func (l *lapse) seen() bool {
	select {
	case <-l.done():
		return true
	default:
		return false
	}
}

// TrustedUntil returns the local deadline until which this term may be
// trusted without asking the database, as a reading of time.Now (with its
// monotonic clock), whatever clock the lease Store was given: the earlier
// of the lease's trust deadline (send time of its last successful renewal +
// TTL − margin) and, but for a lease-only term, Grace after the last
// answered round trip on the advisory session. The leader's context is cancelled when it passes; a
// leader about to do something it cannot fence — send an email, call an API
// that ignores the term — should check it first, since a process stalled by
// the scheduler may run before its timers do. Once the term has ended — its
// lease or advisory lock lost, released or broken, or the elector stepped
// down — it is the zero time, whatever the deadlines said. The zero Term's
// is the zero time. A passed deadline is final: once TrustedUntil has
// returned a time not after the moment it was called, the term is over —
// its elector steps down — and TrustedUntil returns that passed deadline
// until the term has ended, even if a late renewal or session check would
// have moved the deadline on.
func (t Term) TrustedUntil() time.Time {
	if t.lease == nil || t.Context().Err() != nil {
		return time.Time{}
	}
	if t.lapse.seen() {
		return t.lapse.at
	}
	// The lease's deadline is a reading of the Store's clock: carry the time
	// left over to time.Now's. Reading time.Now first errs early, never late.
	now := time.Now()
	until := now.Add(t.lease.TrustedUntil().Sub(t.now()))
	if t.lock == nil {
		return t.checked(now, until) // a lease-only term
	}
	if s := t.lock.VerifiedAt().Add(t.grace); s.Before(until) {
		until = s
	}
	return t.checked(now, until)
}

// checked returns until, the deadline read at now, and records a lapse if
// it has passed; after a lapse it returns the first passed deadline read.
func (t Term) checked(now, until time.Time) time.Time {
	if now.Before(until) {
		return until
	}
	t.lapse.mark(until)
	return t.lapse.at
}

// Guard checks, inside the caller's transaction tx, that this term is still
// the current one (owner, term number and expiry, by the server clock) and
// locks the lease row FOR SHARE, so no later term can begin before tx ends:
// tx's writes commit only while this term leads. It returns an error
// wrapping [lease.ErrNotHeld] when the term is over, and for the zero
// Term, which is no term. While tx is open, [Term.Proclaim] of the same
// term waits for it (its update needs the row that tx locks): do not
// proclaim inside tx. See [lease.Lease.Guard].
func (t Term) Guard(ctx context.Context, tx pgx.Tx) error {
	if t.lease == nil {
		return fmt.Errorf("leader: guard: the zero Term is no term (use the one Run hands to lead): %w", lease.ErrNotHeld)
	}
	return t.lease.Guard(ctx, tx)
}

// Context returns a context cancelled when the term ends, for any reason:
// its lease or advisory lock is lost, released or broken, or the elector
// steps down (after Resign, Run's ctx or a passed trust deadline). The
// context the leader's work gets is cancelled first when the work is asked
// to return (Resign, Run's ctx), while the term still holds; this one when
// it no longer does. The zero Term's is cancelled.
func (t Term) Context() context.Context {
	if t.ctx == nil {
		return ended
	}
	return t.ctx
}

// ended is the context of the zero Term.
var ended = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// termContext returns the context of a term on lk (nil for a lease-only
// term) and ls: cancelled when either ends, or by the returned function
// when the elector steps down.
func termContext(lk *advisory.Lock, ls *lease.Lease) (context.Context, context.CancelCauseFunc) {
	ctx, cancel := context.WithCancelCause(ls.Context())
	if lk == nil {
		return ctx, cancel
	}
	stop := context.AfterFunc(lk.Context(), func() { cancel(context.Cause(lk.Context())) })
	return ctx, func(cause error) {
		stop()
		cancel(cause)
	}
}

// Leader is what a candidate or observer sees of an election's current
// state, read from the lease row by the server clock.
type Leader struct {
	// Election is the election's name.
	Election string
	// Held reports whether some candidate leads now (its lease has not
	// expired by the server clock). The fields below describe the latest
	// term, held or not.
	Held bool
	// Identity is the leader's identity.
	Identity string
	// Term is the term number.
	Term int64
	// Since is when the term began, by the server clock.
	Since time.Time
	// Expiry is when the term's lease expires unless renewed, by the
	// server clock.
	Expiry time.Time
	// Hostname and PID identify the leader's process.
	Hostname string
	PID      int
	// Value is what the leader publishes with its term (Config.Value,
	// changed by [Term.Proclaim]).
	Value string

	owner      uuid.UUID
	sessionPID uint32 // the advisory lock's backend
	meta       meta
	localEnd   time.Time // Expiry as a reading of time.Now, from the time left when read
}

// meta is the JSON kept in the lease row's metadata column: who leads, the
// backend holding its campaign lock, and the leader's own trust horizon as
// it uses it — a candidate taking over waits for the longer of its own
// Grace and the holder's (see the package doc). Durations are Go duration
// strings ("1.2s"), exact. A lease-only leader records Campaign
// "lease-only", and neither a session nor a Grace: a session-mode taker
// then waits for its lease to expire or be released, and terminates no
// backend for it. Versions without lease-only mode read the Grace only,
// and break blindly after waiting: see the package doc on mixing them.
type meta struct {
	Identity   string `json:"identity"`
	SessionPID uint32 `json:"session_pid"`
	Grace      string `json:"grace,omitempty"`
	Ping       string `json:"ping_interval,omitempty"`
	TTL        string `json:"ttl,omitempty"`
	Margin     string `json:"safety_margin,omitempty"`
	Campaign   string `json:"campaign,omitempty"`
	Value      string `json:"value,omitempty"`
	// HandOverTo names the candidate a leader handed its term to, written
	// just before it released the lease (see handover.go).
	HandOverTo string `json:"hand_over_to,omitempty"`
}

// horizon returns the holder's recorded Grace; false when the row records
// none (a lease-only holder, a holder of a version before horizons were
// recorded, or a foreign one), or records a campaign other than a session-mode one.
func (m meta) horizon() (time.Duration, bool) {
	if m.Campaign != "" {
		return 0, false
	}
	g, err := time.ParseDuration(m.Grace)
	if err != nil || g <= 0 {
		return 0, false
	}
	return g, true
}

func leaderFromInfo(election string, info lease.Info) Leader {
	var m meta
	_ = json.Unmarshal(info.Metadata, &m) // absent or foreign metadata: zero
	return Leader{
		Election:   election,
		Held:       info.Held,
		Identity:   m.Identity,
		Term:       info.Token,
		Since:      info.AcquiredAt,
		Expiry:     info.ExpiresAt,
		Hostname:   info.Hostname,
		PID:        info.PID,
		Value:      m.Value,
		owner:      info.Owner,
		sessionPID: m.SessionPID,
		meta:       m,
		localEnd:   time.Now().Add(info.TimeLeft),
	}
}

// sameTerm reports whether a and b show the same leader in the same term.
func sameTerm(a, b Leader) bool {
	return a.Held == b.Held && a.Term == b.Term && a.owner == b.owner
}
