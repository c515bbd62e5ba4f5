package leader

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/internal/deflog"
	"github.com/pglocks/pglocks/internal/ident"
	"github.com/pglocks/pglocks/lease"
)

// Defaults of [Config].
const (
	DefaultTTL           = 15 * time.Second
	DefaultRetryInterval = time.Second
	DefaultChannel       = "pglocks_leader"
)

// Lower bounds of [Config]'s durations: [New] refuses smaller values, so
// that no setting turns the campaign's or the leader's loop into a busy one.
const (
	// MinTTL bounds Config.TTL below: it is [lease.MinTTL], the shortest
	// TTL of any lease, for the reason given there.
	MinTTL = lease.MinTTL
	// MinRenewInterval bounds Config.RenewInterval below: a leader sends
	// at most 100 renewals a second (each a statement and a commit).
	MinRenewInterval = 10 * time.Millisecond
	// MinRetryInterval bounds Config.RetryInterval below: a candidate
	// reads the lease row at most about 100 times a second, and its
	// backoff after a failed campaign starts no lower.
	MinRetryInterval = 10 * time.Millisecond
)

// ErrInvalidConfig is wrapped by every error [New] returns about its Config.
var ErrInvalidConfig = errors.New("leader: invalid config")

// Config configures an [Elector]. Name and Pool are required; every other
// field has a documented default, and the zero value of each means that
// default.
type Config struct {
	// Name names the election. Candidates with the same Name on the same
	// database elect one leader among them. It must pass
	// [pglocks.ValidateName], be at most 900 bytes, and not hold "#c:" or
	// "#req:": the lease rows of the election's candidates and requests
	// are named "pglocks.leader:" + Name + "#c:" + identity and + "#req:" +
	// term, and an election named "svc#c:bar" would share its lease row
	// with candidate "bar" of election "svc". Elections named so by an
	// earlier version must be renamed (New refuses them).
	Name string

	// Pool is the connection pool for the lease row, notifications and
	// inspection. Required.
	Pool *pgxpool.Pool

	// Mode is how the elector campaigns: [ModeSession] gates the campaign
	// with a session advisory lock for a fast failover after a crash;
	// [ModeLeaseOnly] uses the lease alone and works behind any pooler,
	// failing over after a crash once the lease expires (within TTL);
	// [ModeAuto] is ModeSession unless the Locker reports that its pool is
	// behind a pooler in transaction mode, and then ModeLeaseOnly.
	// Candidates in different modes may share an election once every
	// session-mode candidate runs a version with Mode (see the package
	// doc). Default: ModeAuto.
	Mode Mode

	// Locker holds the campaign's advisory lock. Share one Locker among
	// many elections: its few sessions hold every election's lock.
	// ModeLeaseOnly does not use it. Default: a Locker of its own on Pool
	// (none in ModeLeaseOnly), closed by [Elector.Close].
	Locker *advisory.Locker

	// Store holds the election's lease row (named "pglocks.leader:" +
	// Name). Its table must exist ([lease.Store.Migrate]): without it Run
	// returns an error wrapping [lease.ErrNoTable] that says how to create
	// it. Default: a Store of its own on Pool with the default table,
	// closed by [Elector.Close].
	Store *lease.Store

	// Identity names this candidate in the lease row, in [Leader] and in
	// logs. Default: hostname-pid-random.
	Identity string

	// Value is what this candidate publishes: recorded in its candidate
	// row ([Candidates]) and, while it leads, with its term ([Leader].Value),
	// for followers that need, say, the leader's address. [Term.Proclaim]
	// changes it during a term. At most [MaxValueLen] bytes of valid UTF-8,
	// without NUL (jsonb cannot store it). Default: empty.
	Value string

	// HandOverOnClose makes a leader that stops because Run's ctx ended or
	// the elector is closed (SIGTERM in a rolling deploy) hand its term
	// over to another live candidate, as [Elector.HandOver] with "" does
	// (the one that joined last: in a rolling deploy, a new pod),
	// instead of only resigning: the successor takes the next term as soon
	// as this leader's work has returned, with no candidate racing it. With
	// no other live candidate it just resigns. Default: false.
	HandOverOnClose bool

	// TTL is the lease's time to live: how long a leader that can no longer
	// reach the database may keep the lease before another candidate may
	// take it, and so the longest failover when the server keeps a
	// partitioned leader's session open. Default: 15s. Minimum: [MinTTL]
	// (100ms).
	TTL time.Duration

	// RenewInterval is how often the leader's lease is renewed. The
	// Store's batched keep-alive renews it, together with every other
	// kept-alive lease of the Store (other elections' terms, candidate
	// rows), in one statement per round: the Store's cadence for TTL —
	// TTL × its lease.Config.RenewFraction — is what counts. A Store the
	// elector makes itself (Store nil) is given the RenewFraction that
	// makes that cadence RenewInterval. With a Store given, the Store's
	// cadence wins: [Elector.Config] reports it as RenewInterval, and an
	// explicit RenewInterval that differs is logged at Warn and not used.
	// It must be below TTL/2, so that a failed renewal leaves time for
	// another, and below TTL − the Store's SafetyMargin. Default: TTL/3
	// (with a given Store: its cadence). Minimum: 10ms.
	RenewInterval time.Duration

	// RetryInterval is how often a candidate that is not the leader checks
	// on the current leader (for a stale one, and to report a new one to
	// OnNewLeader), and how long a resigned leader sits out before it
	// campaigns again. Jittered ±20%. Default: 1s. Minimum: 10ms.
	RetryInterval time.Duration

	// Grace bounds how long a leader trusts its advisory session after the
	// last round trip on it succeeded; it is recorded in the lease row, and
	// a new leader whose predecessor's lease is still unexpired waits the
	// longer of its own Grace and the predecessor's after taking the
	// advisory lock before it takes the lease over (see the package doc).
	// It must exceed 1.5 × the Locker's PingInterval plus a round trip.
	// Default: 3 × the Locker's PingInterval (600ms with the advisory
	// default).
	//
	// Grace trades failover after a crash (a SIGKILLed leader is replaced
	// after about the longer of the two candidates' Graces) against
	// tolerance of stalls (a leader whose process cannot run for about
	// Grace − PingInterval steps down). Measured on 2 cores: 100 healthy
	// elections in one process, 2 minutes with 4 or 16 CPU-burning
	// processes, under -race too: no spurious demotion with the default;
	// SIGKILL failover p99 0.75s (1.24s with 4 burners), and 1.05s with
	// Grace 1s. Raise it where processes stall longer — long GC pauses,
	// CPU quotas (cgroup throttling), overcommitted VMs.
	Grace time.Duration

	// NoTerminate keeps a candidate from terminating the server session of
	// a stale leader: one whose lease has expired while its session still
	// holds the advisory lock (a partitioned leader the server has not
	// dropped yet). Then the election waits for the server to drop that
	// session. Default: terminate it (pg_terminate_backend, which needs the
	// same role or pg_signal_backend) — but never a session that holds any
	// other advisory lock (see the package doc).
	NoTerminate bool

	// Channel is the LISTEN/NOTIFY channel on which leadership changes are
	// announced to [Elector.Observe]. It must be a plain identifier.
	// Default: "pglocks_leader".
	Channel string

	// Logger receives the elector's events: Info for elections and
	// demotions, and for a request to resign or hand over; Warn for lost
	// terms, for a candidate row lost other than by such a request, for
	// the fallbacks behind a pooler in transaction mode (lease-only
	// campaigns, a polling Observe) and, once per run of failures, for
	// retried failures — the first campaign, or the first read of the
	// lease row, that fails after a success (or first of all) is logged
	// at Warn with its cause, the next ones at Debug, and the one that
	// ends the run at Warn ("leader: campaign
	// reached the database again", "leader: read lease succeeded again",
	// with the number of failures and how long they lasted); Error for a
	// campaign that cannot succeed (which Run also returns). Default:
	// slog.Default(), Warn and above only — failures and fallbacks reach a
	// program that configured nothing, elections do not; give
	// slog.New(slog.DiscardHandler) for silence, and see [Elector.State]
	// for the same facts without a logger.
	Logger *slog.Logger

	// Observer receives the election's events for metrics: each term's
	// start and end (see [pglocks.Observer] and package otelpglocks). The
	// Locker and Store the elector makes itself (when Locker or Store is
	// nil) report to it too, and log to Logger. Default: none.
	Observer *pglocks.Observer

	// OnElected is called when this candidate becomes leader, OnDemoted
	// when it stops being leader, with the reason, and OnNewLeader when a
	// candidate sees a new leader (itself included). They run one at a
	// time, in order, on a goroutine of their own: they may block without
	// holding up the election, but should not block for long.
	OnElected   func(Term)
	OnDemoted   func(term Term, reason error)
	OnNewLeader func(Leader)
}

// leaseName is the lease row of an election.
func leaseName(election string) string { return "pglocks.leader:" + election }

// maxNameLen keeps the lease name within lease.MaxNameLen.
const maxNameLen = 900

func (c *Config) setDefaults(ping time.Duration) {
	if c.Identity == "" {
		c.Identity = defaultIdentity()
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = c.TTL / 3
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = DefaultRetryInterval
	}
	if c.Grace == 0 {
		c.Grace = 3 * ping
	}
	if c.Channel == "" {
		c.Channel = DefaultChannel
	}
	c.Logger = deflog.Or(c.Logger)
}

// validate checks c after setDefaults; ping is the Locker's PingInterval
// (the advisory default when there is no Locker).
func (c *Config) validate(ping time.Duration) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case pglocks.ValidateName(c.Name) != nil:
		return bad("Name: %v", pglocks.ValidateName(c.Name))
	case len(c.Name) > maxNameLen:
		return bad("Name is %d bytes, more than %d", len(c.Name), maxNameLen)
	case checkElection(c.Name) != nil:
		return bad("Name: %v", checkElection(c.Name))
	case c.Mode < ModeAuto || c.Mode > ModeLeaseOnly:
		return bad("Mode %d is not ModeAuto, ModeSession or ModeLeaseOnly", int(c.Mode))
	case c.TTL < 0 || c.RenewInterval < 0 || c.RetryInterval < 0 || c.Grace < 0:
		return bad("TTL, RenewInterval, RetryInterval and Grace must not be negative")
	case c.TTL < MinTTL:
		return bad("TTL %v is below the minimum of %v", c.TTL, MinTTL)
	case c.RenewInterval < MinRenewInterval:
		return bad("RenewInterval %v is below the minimum of %v", c.RenewInterval, MinRenewInterval)
	case c.RetryInterval < MinRetryInterval:
		return bad("RetryInterval %v is below the minimum of %v", c.RetryInterval, MinRetryInterval)
	case c.RenewInterval >= c.TTL/2:
		return bad("RenewInterval %v must be below TTL/2 (TTL is %v)", c.RenewInterval, c.TTL)
	case c.Mode != ModeLeaseOnly && c.Grace <= ping+ping/2: // a lease-only campaign has no session
		return bad("Grace %v must exceed 1.5 × the Locker's PingInterval %v", c.Grace, ping)
	case c.Mode != ModeLeaseOnly && c.Grace >= c.TTL:
		return bad("Grace %v must be below TTL %v", c.Grace, c.TTL)
	case checkValue(c.Value) != nil:
		return bad("Value: %v", checkValue(c.Value))
	case len(candidateName(c.Name, c.Identity)) > lease.MaxNameLen || pglocks.ValidateName(candidateName(c.Name, c.Identity)) != nil:
		return bad("Identity %q: with Name, its candidate row name is not a valid lease name of at most %d bytes", c.Identity, lease.MaxNameLen)
	case ident.Check(c.Channel) != nil:
		return bad("Channel: %v", ident.Check(c.Channel))
	}
	return nil
}

// useStore sets c.Store — a Store of the elector's own when c has none,
// whose keep-alive renews leases of c.TTL every c.RenewInterval — and
// checks c against it. With a Store given, its keep-alive's cadence for
// c.TTL (TTL × its RenewFraction) wins and becomes c.RenewInterval; an
// explicit RenewInterval (explicit) that differs is logged at Warn.
func (e *Elector) useStore(c *Config, explicit bool) error {
	if c.Store == nil {
		s, err := lease.New(c.Pool, lease.Config{Logger: c.Logger, Observer: c.Observer,
			RenewFraction: renewFraction(c.TTL, c.RenewInterval)})
		if err != nil {
			return fmt.Errorf("leader: %w", err)
		}
		c.Store, e.ownStore = s, true
	} else if every := cadence(c.TTL, c.Store.Config().RenewFraction); every != c.RenewInterval {
		if explicit && (every-c.RenewInterval > c.RenewInterval/1000 || c.RenewInterval-every > c.RenewInterval/1000) {
			c.Logger.Warn("leader: Config.RenewInterval is not used: the term's lease is renewed by the given Store's keep-alive, every TTL × its RenewFraction",
				"election", c.Name, "renew_interval", c.RenewInterval, "store_renews_every", every)
		}
		c.RenewInterval = every
	}
	return c.validateStore(c.Store.Config())
}

// renewFraction returns the lease RenewFraction with which a Store's
// keep-alive renews a lease of ttl every `every`: the smallest one whose
// cadence (see cadence) is not below every.
func renewFraction(ttl, every time.Duration) float64 {
	f := float64(every) / float64(ttl)
	for cadence(ttl, f) < every {
		f = math.Nextafter(f, 1)
	}
	return f
}

// cadence is how often a Store with RenewFraction f renews a kept-alive
// lease of ttl, computed as package lease does.
func cadence(ttl time.Duration, f float64) time.Duration {
	return time.Duration(float64(ttl) * f)
}

// validateStore checks the TTL against the Store the lease lives in: within
// its MaxTTL, and leaving room for a renewal — c.RenewInterval, the Store's
// keep-alive cadence — before the trust deadline.
func (c *Config) validateStore(sc lease.Config) error {
	margin := sc.SafetyMargin
	if margin == 0 {
		margin = c.TTL / 10
	}
	switch {
	case c.TTL > sc.MaxTTL:
		return fmt.Errorf("%w: TTL %v exceeds the Store's MaxTTL %v", ErrInvalidConfig, c.TTL, sc.MaxTTL)
	case c.TTL <= margin:
		return fmt.Errorf("%w: TTL %v must exceed the Store's SafetyMargin %v", ErrInvalidConfig, c.TTL, margin)
	case c.RenewInterval < MinRenewInterval:
		return fmt.Errorf("%w: the Store's keep-alive would renew every %v (TTL %v × its RenewFraction %v), below the minimum of %v",
			ErrInvalidConfig, c.RenewInterval, c.TTL, sc.RenewFraction, MinRenewInterval)
	case c.RenewInterval >= c.TTL-margin:
		return fmt.Errorf("%w: RenewInterval %v must be below TTL − the Store's SafetyMargin (%v)", ErrInvalidConfig, c.RenewInterval, c.TTL-margin)
	}
	return nil
}

func defaultIdentity() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b)
}
