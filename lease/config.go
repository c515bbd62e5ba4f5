package lease

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/internal/deflog"
	"github.com/pglocks/pglocks/internal/ident"
)

const (
	// DefaultSchema is the schema of the lease table unless Config.Schema
	// names another.
	DefaultSchema = "public"
	// DefaultTable is the lease table's name unless Config.Table names
	// another.
	DefaultTable = "pglocks_leases"
	// DefaultMaxTTL is the longest TTL a store accepts unless Config.MaxTTL
	// says otherwise.
	DefaultMaxTTL = 24 * time.Hour
	// MinTTL is the shortest TTL any store accepts, and the shortest TTL
	// of a leader's term (leader.MinTTL is this): a holder trusts its lease
	// for TTL − SafetyMargin from the send time of its acquire or renew,
	// and that window must outlast what a healthy system routinely adds —
	// round trips of a few milliseconds, tens of milliseconds of GC or
	// scheduling pauses on a busy host. Below about 100ms, a lease is lost
	// in normal operation (a 1ms lease, once accepted, was lost before its
	// holder could use it).
	MinTTL = 100 * time.Millisecond
	// MinRenewInterval is the shortest renewal interval of a kept-alive
	// lease, TTL × Config.RenewFraction, that a store accepts: at most 100
	// renewals (commits) a second per lease, the bound of advisory's pings
	// and leader's renewals; a shorter one (a tiny RenewFraction makes it
	// 0) would renew back to back.
	MinRenewInterval = 10 * time.Millisecond
	// MinCheckInterval is the shortest Config.CheckInterval.
	MinCheckInterval = time.Millisecond
	// MaxMaxTTL caps Config.MaxTTL: about ten years.
	MaxMaxTTL = 10 * 365 * 24 * time.Hour
	// DefaultCheckInterval is Config.CheckInterval unless set.
	DefaultCheckInterval = 5 * time.Second
	// DefaultBatchAfter is Config.BatchAfter unless set.
	DefaultBatchAfter = 8
	// MaxNameLen is the longest lease name, in bytes: well below the
	// 2,704-byte limit of a btree index entry, and of a NOTIFY payload.
	MaxNameLen = 1024
)

// Config configures a [Store]. The zero value is valid: every field has a
// documented default.
type Config struct {
	// Schema is the schema of the lease table. It must be a plain SQL
	// identifier: ASCII letters, digits and underscores, not starting with
	// a digit, at most 63 bytes. Default: "public".
	Schema string

	// Table is the lease table's name, with the rules of Schema.
	// Default: "pglocks_leases".
	Table string

	// Channel is the LISTEN/NOTIFY channel on which releases are announced
	// to waiting [Store.Acquire] calls, and losses to holders, with the
	// rules of Schema. Stores sharing a table must share the channel, and
	// tables in one database must not: a holder would take another
	// table's Break of the same name for its own loss. (Any role that can
	// connect can NOTIFY on it: a forged notice can end a lease early, never
	// extend one or wake a waiter into a held lease.) Default: Table, or
	// Schema + "_" + Table outside the default schema.
	Channel string

	// MaxTTL is the longest TTL the store accepts; longer ones are refused
	// as a likely unit mistake. At least [MinTTL], at most [MaxMaxTTL].
	// Default: 24h.
	MaxTTL time.Duration

	// SafetyMargin is how long before the end of its TTL a holder stops
	// trusting its lease locally: the lease is trusted until the send time
	// of the last successful acquire or renew + TTL − SafetyMargin, on the
	// monotonic clock. It absorbs clock-rate differences between client
	// and server. Zero means TTL/10 for each lease; an explicit margin must
	// be below MaxTTL, and each TTL must exceed it.
	SafetyMargin time.Duration

	// RenewFraction is the fraction of the TTL between two renewals by the
	// keep-alive ([WithKeepAlive], [Store.Do]). It must be in (0, 0.5] so
	// that a failed renewal leaves time for another, and the interval
	// TTL × RenewFraction of each kept-alive lease must be at least
	// [MinRenewInterval] (10ms). Default: 1/3.
	RenewFraction float64

	// CheckInterval bounds how long a kept-alive lease ([WithKeepAlive],
	// [Store.Do]) goes without asking the server whether it still holds:
	// between renewals, every CheckInterval it reads its row (scoped to its
	// owner and token, writing nothing), so that a loss nobody announced —
	// a NOTIFY missed while the store's listener reconnected, a row changed
	// by hand — ends the lease within CheckInterval whatever the TTL. A
	// Break or a takeover is normally heard at once through NOTIFY.
	// Default: 5s. Minimum: 1ms.
	CheckInterval time.Duration

	// BatchAfter is how many releases, and how many retakes of names it
	// released itself, the store runs at once as statements of their own;
	// more wait and run in batches, one statement and one commit each (see
	// the package doc, Batches). Zero means [DefaultBatchAfter]; a negative
	// value turns batching off.
	BatchAfter int

	// Hostname is recorded in the hostname column of every lease this store
	// acquires, for inspection. It must be text the server accepts: valid
	// UTF-8 without NUL bytes (New refuses it otherwise). Default:
	// os.Hostname(), its NUL bytes dropped and invalid bytes replaced.
	Hostname string

	// PID is recorded in the pid column. Default: os.Getpid().
	PID int

	// Now is the local clock, used only to measure durations (send time of
	// a renewal, trust deadlines, timers); expiry itself is always decided
	// by the server clock. It must return readings that carry Go's
	// monotonic clock (time.Now() does, and so does time.Now().Add(skew)).
	// Default: time.Now.
	Now func() time.Time

	// Logger receives the store's events, with attributes lease, owner,
	// token, elapsed, held and err: Debug for acquisitions, busy leases,
	// renewals and releases (routine contention); Warn for lost leases,
	// for the fallback to polling behind a pooler that moves sessions,
	// and, once per run of failures, for failed acquire calls and failed
	// renewals — the first failure after a success (or the first of all)
	// is logged at Warn with its cause, the next ones at Debug, and the
	// call that ends the run at Warn ("lease: acquire succeeded again",
	// "lease: renew succeeded again", with the number of failures and how
	// long they lasted), so that calls looping through an outage log two
	// warnings, not thousands a second. A call refused for its input (n
	// above a semaphore's stored limit), a call its caller cancelled
	// (context.Canceled) before the server may have acquired (after, its
	// outcome is unknown: a failure) and a renewal that finds the lease
	// no longer held (a loss, logged as such) are logged at Debug and are
	// no failure of a run. Default: slog.Default(), Warn
	// and above only — failures and losses reach a program that
	// configured nothing, routine events do not; give
	// slog.New(slog.DiscardHandler) for silence.
	Logger *slog.Logger

	// Observer receives the store's events for metrics (see
	// [pglocks.Observer] and package otelpglocks). Default: none.
	Observer *pglocks.Observer
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.Channel == "" {
		c.Channel = c.Table
		if c.Schema != DefaultSchema {
			c.Channel = c.Schema + "_" + c.Table
		}
	}
	if c.BatchAfter == 0 {
		c.BatchAfter = DefaultBatchAfter
	}
	if c.MaxTTL == 0 {
		c.MaxTTL = DefaultMaxTTL
	}
	if c.RenewFraction == 0 {
		c.RenewFraction = 1.0 / 3
	}
	if c.CheckInterval == 0 {
		c.CheckInterval = DefaultCheckInterval
	}
	if c.Hostname == "" {
		h, _ := os.Hostname() // best effort: metadata only
		c.Hostname = strings.ToValidUTF8(strings.ReplaceAll(h, "\x00", ""), "\uFFFD")
	}
	if c.PID == 0 {
		c.PID = os.Getpid()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	c.Logger = deflog.Or(c.Logger)
	return c
}

// validate checks a Config after withDefaults; its errors name the field.
func (c Config) validate() error {
	for _, f := range []struct{ field, v string }{
		{"Schema", c.Schema}, {"Table", c.Table}, {"Channel", c.Channel},
	} {
		if err := ident.Check(f.v); err != nil {
			return fmt.Errorf("%w: Config.%s: %w", ErrInvalidConfig, f.field, err)
		}
	}
	switch {
	case c.MaxTTL < MinTTL || c.MaxTTL > MaxMaxTTL:
		return fmt.Errorf("%w: Config.MaxTTL %v is outside [%v, %v]", ErrInvalidConfig, c.MaxTTL, MinTTL, MaxMaxTTL)
	case c.SafetyMargin < 0:
		return fmt.Errorf("%w: Config.SafetyMargin %v is negative", ErrInvalidConfig, c.SafetyMargin)
	case c.SafetyMargin >= c.MaxTTL:
		return fmt.Errorf("%w: Config.SafetyMargin %v must be less than Config.MaxTTL %v", ErrInvalidConfig, c.SafetyMargin, c.MaxTTL)
	case !(c.RenewFraction > 0 && c.RenewFraction <= 0.5):
		return fmt.Errorf("%w: Config.RenewFraction %v is outside (0, 0.5]", ErrInvalidConfig, c.RenewFraction)
	case c.CheckInterval < MinCheckInterval:
		return fmt.Errorf("%w: Config.CheckInterval %v is below %v", ErrInvalidConfig, c.CheckInterval, MinCheckInterval)
	case c.PID < 0 || c.PID > 1<<31-1:
		return fmt.Errorf("%w: Config.PID %d is not a process id", ErrInvalidConfig, c.PID)
	}
	if err := checkText(c.Hostname); err != nil {
		return fmt.Errorf("%w: Config.Hostname %q %w", ErrInvalidConfig, short(c.Hostname), err)
	}
	return nil
}

// margin returns the safety margin for a lease of the given TTL.
func (c Config) margin(ttl time.Duration) time.Duration {
	if c.SafetyMargin > 0 {
		return c.SafetyMargin
	}
	return ttl / 10
}

// renewInterval is how often the keep-alive renews a lease of the given TTL.
func (c Config) renewInterval(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl) * c.RenewFraction)
}

// options are the per-call options of TryAcquire, Acquire, Resume and Do.
type options struct {
	owner      uuid.UUID
	hasOwner   bool
	metadata   json.RawMessage
	keepAlive  bool
	maxHold    time.Duration // WithMaxHold; 0 without
	hasMaxHold bool
}

// Option configures one TryAcquire, Acquire, Resume or Do call. A nil
// Option does nothing.
type Option func(*options)

// applyOptions returns the options opts set, skipping nil ones.
func applyOptions(opts []Option) options {
	var o options
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}

// WithOwner makes the lease's owner id instead of a fresh random UUID v4;
// it must not be the zero UUID. Acquiring with the owner of a lease already
// held does not re-enter it: a lease is free only when released or expired.
// An attempt whose outcome is unknown is cleaned up by its own attempt id,
// never by owner, so it cannot free another acquisition by the same owner.
func WithOwner(id uuid.UUID) Option {
	return func(o *options) { o.owner, o.hasOwner = id, true }
}

// WithMetadata records free-form JSON with the lease (metadata column), for
// inspection. It must be JSON that PostgreSQL's jsonb accepts: valid UTF-8,
// no \u0000 escape, no unpaired surrogate escape, numbers within numeric's
// range (at most 131072 digits before the decimal point, 16383 after).
// The acquire call refuses anything else before sending a statement, with
// an error naming WithMetadata that no retry can cure.
func WithMetadata(doc json.RawMessage) Option {
	return func(o *options) { o.metadata = doc }
}

// WithKeepAlive renews the lease in the background every
// TTL × Config.RenewFraction, and checks it every Config.CheckInterval in
// between, until it is released or lost; see [Lease.Lost]. The TTL must
// leave room for that: TTL − SafetyMargin > TTL × RenewFraction. A store
// renews (and checks) all its kept-alive leases together, one statement
// per round: a lease due is renewed with every lease due within the next
// half of its interval, so it may be renewed up to half an interval early.
func WithKeepAlive() Option {
	return func(o *options) { o.keepAlive = true }
}
