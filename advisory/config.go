package advisory

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/internal/deflog"
	"github.com/pglocks/pglocks/internal/ident"
)

// Defaults of [Config]: the value a zero field takes.
const (
	// DefaultMaxSessions is the default of Config.MaxSessions.
	DefaultMaxSessions = 3
	// DefaultApplicationName is the default of Config.ApplicationName.
	DefaultApplicationName = "pglocks"
	// DefaultChannel is the default of Config.Channel.
	DefaultChannel = "pglocks_advisory"
	// DefaultMinBackoff is the default of Config.MinBackoff.
	DefaultMinBackoff = 2 * time.Millisecond
	// DefaultMaxBackoff is the default of Config.MaxBackoff.
	DefaultMaxBackoff = 100 * time.Millisecond
	// DefaultPingInterval is the default of Config.PingInterval.
	DefaultPingInterval = 200 * time.Millisecond
	// DefaultQueryTimeout is the default of Config.QueryTimeout.
	DefaultQueryTimeout = 2 * time.Second
	// DefaultKeepalivesIdle is the default of Config.KeepalivesIdle.
	DefaultKeepalivesIdle = 5 * time.Second
	// DefaultKeepalivesInterval is the default of Config.KeepalivesInterval.
	DefaultKeepalivesInterval = 1 * time.Second
	// DefaultKeepalivesCount is the default of Config.KeepalivesCount.
	DefaultKeepalivesCount = 3
	// DefaultTCPUserTimeout is the default of Config.TCPUserTimeout.
	DefaultTCPUserTimeout = 10 * time.Second
)

// Lower bounds of [Config]'s intervals: smaller non-zero values are
// refused by [New], so that no setting turns a loop into a busy one.
const (
	// MinPingInterval bounds Config.PingInterval below: an idle session
	// holding locks costs the server a round trip per PingInterval, which
	// is 100 per second at this bound, and a ping's own round trip
	// (0.1–1 ms on a LAN) would otherwise take a large share of the time.
	MinPingInterval = 10 * time.Millisecond
	// MinQueryTimeout bounds Config.QueryTimeout below: a shorter bound
	// than a round trip plus a scheduling delay would declare healthy
	// sessions dead.
	MinQueryTimeout = 10 * time.Millisecond
	// MinMinBackoff bounds Config.MinBackoff below: a waiter's first poll
	// of a busy key comes no sooner.
	MinMinBackoff = time.Millisecond
	// MinMaxBackoff bounds Config.MaxBackoff below: a waiter that is not
	// woken polls a busy key at most 100 times a second.
	MinMaxBackoff = 10 * time.Millisecond
)

// Config configures a [Locker]. The zero value is valid: every zero field
// takes its documented default.
//
// The timing fields obey one rule, which [New] checks: the client gives up on
// a silent session (PingInterval + QueryTimeout) before the server can drop
// it (KeepalivesIdle + KeepalivesInterval × KeepalivesCount, and
// TCPUserTimeout). So when the network between the two fails, the holder
// announces the loss before the server frees the lock for someone else.
//
// The server drops the session by two means. Its TCP keepalives and
// tcp_user_timeout act on its own connection, which is the holder's only
// over a direct connection. Its idle_session_timeout, set to
// TCPUserTimeout on every session that holds locks, ends a session it has
// heard nothing from (no statement, no ping) for TCPUserTimeout, whatever
// lies between: this is the bound behind a session-mode pooler such as
// PgBouncer, or a TCP proxy, whose healthy link to the server outlives a
// partitioned client. It needs PostgreSQL 14 or later; on older servers a
// partitioned holder behind such a pooler keeps its locks until the pooler
// drops the client (PgBouncer: its client TCP keepalive, about two hours
// with the OS defaults). A healthy session is never idle that long: one
// holding locks is pinged at least every min(PingInterval,
// TCPUserTimeout/2), one holding none every TCPUserTimeout/2, so the
// server hears from it at least every TCPUserTimeout/2 (plus a round
// trip). That is the margin of a holder that stops sending for a while
// (a GC pause, an overloaded machine, a stalled scheduler): a stall
// shorter than TCPUserTimeout/2 costs no lock; one longer than
// TCPUserTimeout, or a process that cannot run that long (SIGSTOP, a
// frozen VM), costs the locks — the holder announces it when it runs
// again (TestPingCadence).
//
// Every interval has a lower bound ([MinPingInterval] and so on, stated
// on each field); [New] refuses a smaller non-zero value.
type Config struct {
	// MaxSessions is how many dedicated sessions (server connections) hold
	// this locker's session locks, however many locks it holds. The locker
	// uses one more connection to LISTEN for wake-ups, so the default uses
	// at most four server connections in all. Default: 3.
	MaxSessions int

	// ApplicationName is the application_name of every dedicated session,
	// so that operators see the holders in pg_stat_activity and pg_locks.
	// Default: "pglocks".
	ApplicationName string

	// Channel is the LISTEN/NOTIFY channel on which lockers of the same
	// database wake each other's waiters. Lockers that should wake each
	// other must use the same channel. It must be a plain identifier: ASCII
	// letters, digits and underscores, not starting with a digit, at most
	// 63 bytes. Default: "pglocks_advisory".
	Channel string

	// MinBackoff is the first retry delay of a waiting Lock that was not
	// woken by a notification; each retry doubles it, with jitter, up to
	// MaxBackoff. Default: 2ms. Minimum: 1ms.
	MinBackoff time.Duration

	// MaxBackoff bounds the retry delay of a waiting Lock. It is how late,
	// at worst, a waiter notices a lock freed without a notification: by a
	// crashed holder, a terminated session or a non-pglocks holder (psql).
	// Default: 100ms. Minimum: 10ms.
	MaxBackoff time.Duration

	// PingInterval is how often a dedicated session that holds locks and is
	// otherwise idle is checked with one round trip (a bare protocol Sync):
	// at most PingInterval (plus a round trip) after its last statement or
	// check, and at most TCPUserTimeout/2 after it when that is shorter. A
	// failed check announces the loss of its locks, so this bounds how late
	// the loss of a killed session is noticed; the checks also keep the
	// session from the server's idle bound (TCPUserTimeout), with a margin
	// of TCPUserTimeout/2 at least. Default: 200ms. Minimum: 10ms.
	PingInterval time.Duration

	// QueryTimeout bounds every statement on a dedicated session (try,
	// unlock, ping): a session that does not answer in time is declared
	// dead, its connection is closed and its locks are announced lost. The
	// bound is a socket deadline renewed only when less than half of it is
	// left (to save a system call per statement), so a statement is given
	// at least QueryTimeout/2 and at most QueryTimeout, and a network that
	// goes silent is noticed within PingInterval + QueryTimeout. It does
	// not bound callers: their ctx does. Default: 2s. Minimum: 10ms.
	QueryTimeout time.Duration

	// KeepalivesIdle, KeepalivesInterval and KeepalivesCount set the
	// server's tcp_keepalives_idle, tcp_keepalives_interval and
	// tcp_keepalives_count for each dedicated session (and the client
	// socket's keepalive likewise), so the server drops a partitioned
	// holder's session, and frees its locks, after about
	// KeepalivesIdle + KeepalivesInterval × KeepalivesCount instead of the
	// OS default of about two hours. They act on the server's own TCP
	// connection: behind a pooler or proxy, TCPUserTimeout is the bound
	// (see the timing rule above). Defaults: 5s, 1s and 3. Minimum: 1s for
	// the two durations, which must be whole seconds (PostgreSQL's unit).
	KeepalivesIdle     time.Duration
	KeepalivesInterval time.Duration
	KeepalivesCount    int

	// TCPUserTimeout sets the server's tcp_user_timeout for each dedicated
	// session: how long sent data may stay unacknowledged before the server
	// drops the connection. On PostgreSQL 14 and later it is also the
	// idle_session_timeout of each dedicated session and of the LISTEN
	// connection: the server ends a session it has heard nothing from for
	// that long, which frees a partitioned holder's locks behind a
	// session-mode pooler too (a healthy one sends a round trip every
	// TCPUserTimeout/2 at least). Default: 10s. Minimum: more than
	// PingInterval + QueryTimeout (the timing rule), in whole milliseconds.
	TCPUserTimeout time.Duration

	// Logger receives the locker's events, with attributes key, pid,
	// elapsed, held and err: Debug for acquisitions, busy keys and
	// releases (routine contention); Warn for lost locks and, once per
	// run of failures, for failed acquire calls — the first failure after
	// a success (or the first of all) is logged at Warn with its cause,
	// the next ones at Debug, and the acquisition that ends the run at
	// Warn ("advisory: acquire succeeded again", with the number of
	// failures and how long they lasted), so that tries looping through an
	// outage log two warnings, not thousands a second. Default:
	// slog.Default(), Warn and above only — failures and losses reach a
	// program that configured nothing, routine events do not; give
	// slog.New(slog.DiscardHandler) for silence.
	//
	// The Logger and the Observer are called with none of the locker's
	// locks held, one event at a time in order, from the goroutine of the
	// call that caused the event (TryLock, Unlock, …) or from one of the
	// locker's own, which Close waits for: one that blocks delays other
	// events and that call, never the pings that keep the locks.
	Logger *slog.Logger

	// Observer receives the locker's events for metrics (see
	// [pglocks.Observer] and package otelpglocks), as Logger does. An
	// event may reach it after the call that caused it returned. Default:
	// none.
	Observer *pglocks.Observer
}

// pingEvery is the longest a session holding locks goes without a round
// trip: PingInterval, or TCPUserTimeout/2 when that is shorter, so that the
// server's idle bound (idle_session_timeout = TCPUserTimeout) leaves a
// healthy holder a margin of TCPUserTimeout/2 at least.
func (c Config) pingEvery() time.Duration { return min(c.PingInterval, c.TCPUserTimeout/2) }

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	setDur := func(d *time.Duration, def time.Duration) {
		if *d == 0 {
			*d = def
		}
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = DefaultMaxSessions
	}
	if c.ApplicationName == "" {
		c.ApplicationName = DefaultApplicationName
	}
	if c.Channel == "" {
		c.Channel = DefaultChannel
	}
	if c.KeepalivesCount == 0 {
		c.KeepalivesCount = DefaultKeepalivesCount
	}
	setDur(&c.MinBackoff, DefaultMinBackoff)
	setDur(&c.MaxBackoff, DefaultMaxBackoff)
	setDur(&c.PingInterval, DefaultPingInterval)
	setDur(&c.QueryTimeout, DefaultQueryTimeout)
	setDur(&c.KeepalivesIdle, DefaultKeepalivesIdle)
	setDur(&c.KeepalivesInterval, DefaultKeepalivesInterval)
	setDur(&c.TCPUserTimeout, DefaultTCPUserTimeout)
	c.Logger = deflog.Or(c.Logger)
	return c
}

// validate checks a config that has its defaults; the error names the field.
func (c Config) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.MaxSessions < 0 {
		bad("MaxSessions must not be negative, got %d", c.MaxSessions)
	}
	for _, f := range []struct {
		name     string
		d, floor time.Duration
	}{
		{"MinBackoff", c.MinBackoff, MinMinBackoff}, {"MaxBackoff", c.MaxBackoff, MinMaxBackoff},
		{"PingInterval", c.PingInterval, MinPingInterval}, {"QueryTimeout", c.QueryTimeout, MinQueryTimeout},
		{"KeepalivesIdle", c.KeepalivesIdle, 0}, {"KeepalivesInterval", c.KeepalivesInterval, 0},
		{"TCPUserTimeout", c.TCPUserTimeout, 0},
	} {
		if f.d < 0 {
			bad("%s must not be negative, got %v", f.name, f.d)
		} else if f.d < f.floor {
			bad("%s must be at least %v, got %v", f.name, f.floor, f.d)
		}
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"KeepalivesIdle", c.KeepalivesIdle}, {"KeepalivesInterval", c.KeepalivesInterval}} {
		if f.d > 0 && f.d%time.Second != 0 {
			bad("%s must be whole seconds (PostgreSQL's unit), got %v", f.name, f.d)
		}
	}
	if c.TCPUserTimeout > 0 && c.TCPUserTimeout%time.Millisecond != 0 {
		bad("TCPUserTimeout must be whole milliseconds, got %v", c.TCPUserTimeout)
	}
	if c.KeepalivesCount < 0 {
		bad("KeepalivesCount must not be negative, got %d", c.KeepalivesCount)
	}
	if c.MinBackoff > c.MaxBackoff {
		bad("MinBackoff (%v) must not exceed MaxBackoff (%v)", c.MinBackoff, c.MaxBackoff)
	}
	detect := c.PingInterval + c.QueryTimeout
	keepalive := c.KeepalivesIdle + c.KeepalivesInterval*time.Duration(c.KeepalivesCount)
	if detect >= keepalive {
		bad("PingInterval + QueryTimeout (%v) must be less than KeepalivesIdle + KeepalivesInterval × KeepalivesCount (%v): "+
			"the holder must notice a dead session before the server frees its locks", detect, keepalive)
	}
	if detect >= c.TCPUserTimeout {
		bad("PingInterval + QueryTimeout (%v) must be less than TCPUserTimeout (%v), the server's tcp_user_timeout "+
			"and idle_session_timeout of a lock session: the holder must notice a dead session before the server frees its locks, "+
			"and a healthy session must be pinged before the server ends it", detect, c.TCPUserTimeout)
	}
	if err := ident.Check(c.Channel); err != nil {
		bad("Channel: %v", err)
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("advisory: invalid Config: %w", errors.Join(errs...))
}
