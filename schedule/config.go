package schedule

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/ident"
	"github.com/pglocks/pglocks/internal/outcome"
	"github.com/pglocks/pglocks/lease"
)

const (
	// DefaultSchema is the schema of the run table unless Config.Schema
	// names another.
	DefaultSchema = "public"
	// DefaultTable is the run table's name unless Config.Table names
	// another.
	DefaultTable = "pglocks_runs"
	// DefaultHistory is Config.History unless set.
	DefaultHistory = 20
	// MaxHistory caps Config.History.
	MaxHistory = 10000
	// DefaultTolerance is Policy.Tolerance unless set, or a quarter of
	// Policy.Period when that is shorter.
	DefaultTolerance = 5 * time.Second
	// DefaultTTL is Policy.TTL unless set.
	DefaultTTL = 30 * time.Second
	// MinPeriod is the shortest Policy.Period.
	MinPeriod = time.Millisecond
	// MaxJobLen is the longest job name, in bytes.
	MaxJobLen = 512
	// LeasePrefix starts the name of every job's lease: the lease of job
	// "report" is "schedule:report".
	LeasePrefix = "schedule:"
)

// ErrInvalid is wrapped by every error about bad input: a Config, a Policy,
// a job name or a slot key. No retry cures it.
var ErrInvalid = errors.New("schedule: invalid input")

// Config configures a [Runner]. Store and Pool are required; every other
// field has a documented default.
type Config struct {
	// Store is the lease store whose leases the runs hold: one lease per
	// job, named [LeasePrefix] + job. Required.
	Store *lease.Store

	// Pool reaches the database of the run table, which must be the lease
	// table's database: a run is marked in a transaction guarded by its
	// lease ([lease.Lease.Guard]). Usually the pool the Store uses.
	// Required.
	Pool *pgxpool.Pool

	// Schema is the run table's schema: a plain SQL identifier (ASCII
	// letters, digits and underscores, not starting with a digit, at most
	// 63 bytes). Default: "public".
	Schema string

	// Table is the run table's name, with the rules of Schema.
	// Default: "pglocks_runs".
	Table string

	// History is how many runs of each job the table keeps, newest first:
	// slot, owner, token, start, end, outcome. A slot is remembered as run
	// while its run is among them, so a job must not be asked to run a
	// slot older than its last History runs. Start never does: it marks a
	// period slot only while the slot's window is open by the server clock
	// and no later slot has run (a Start that stalled past that gets
	// [ErrWindowClosed]); an explicit key passed to StartSlot is the
	// caller's to keep in order. At least 1, at most [MaxHistory].
	// Default: 20.
	History int
}

// Policy says when a job runs. The zero Policy is valid for
// [Job.StartSlot] (explicit slot keys) only; [Job.Start] needs Period,
// AtLeast or both.
type Policy struct {
	// Period cuts the server's clock into slots aligned to multiples of
	// Period since the Unix epoch (1h: every hour on the hour, UTC), and
	// Start runs the slot of the moment it asks, by the server's clock, at
	// most once. At least [MinPeriod]; zero for no slots.
	Period time.Duration

	// Tolerance is how early a replica may ask for a slot and still get
	// it: a Start whose server time is within Tolerance before a slot's
	// start runs that slot, not the one ending. So the slot of server time
	// t is floor((t + Tolerance) / Period), and a replica whose timer fires
	// up to Tolerance early or up to Period − Tolerance late lands on the
	// intended slot. It must be below Period/2. Zero means the default,
	// 5s or Period/4 when that is shorter; for (almost) none, set 1µs: a
	// slot then runs only for a Start at or after its start.
	Tolerance time.Duration

	// AtLeast is ShedLock's lockAtLeastFor: a run starts only if no run of
	// the job started (by the server clock) within the last AtLeast — "not
	// more often than every AtLeast", whatever the slots. With Period,
	// keep AtLeast ≤ Period − 2×Tolerance: runs of two slots in a row may
	// start that close together (a replica Tolerance late, the next one
	// Tolerance early), and a larger AtLeast may skip the second slot
	// (AtLeast = Period does whenever a slot's ticks come earlier in it
	// than the last run's did). Zero: no such limit.
	AtLeast time.Duration

	// AtMost is ShedLock's lockAtMostFor: the longest a run holds the job.
	// The run's lease is then taken for AtMost and not renewed, so the
	// server frees the job AtMost after the run started whatever the run
	// does, and the run's Context ends a safety margin before (the lease's
	// Config.SafetyMargin, TTL/10 by default). A run that ignores its
	// Context goes on after AtMost without the job: its row shows it
	// [Crashed], and the next Start may begin while it runs (see
	// RerunCrashed). At least lease.MinTTL (100ms). Zero: the lease is
	// taken for TTL and renewed in the background for as long as the run
	// lasts.
	AtMost time.Duration

	// TTL is the time to live of a run's lease when AtMost is zero: it is
	// renewed every TTL × the store's RenewFraction while the run lasts,
	// and a run whose process died frees the job within TTL. At least
	// lease.MinTTL (100ms). Default: 30s.
	TTL time.Duration

	// RerunCrashed lets a replica run a slot again, within the slot's
	// window, when the slot's run crashed: its lease ended before its end
	// was recorded — TTL after its process died or lost the database, or
	// at AtMost, whether or not the run still goes on. A run that outlasts
	// AtMost and ignores its Context is thus run a second time while it
	// still runs: the two overlap, and only fencing (Run.Lease) keeps the
	// first one's writes out. By default such a slot is not run again: a
	// crashed run may have done part or all of its work, and a second run
	// could repeat it.
	RerunCrashed bool
}

// Validate checks p on its own, as [Runner.Job] does: an error wrapping
// [ErrInvalid] names the field.
func (p Policy) Validate() error {
	switch {
	case p.Period < 0:
		return invalid("Policy.Period is %v: it must be positive, or zero for no slots", p.Period)
	case p.Period > 0 && p.Period < MinPeriod:
		return invalid("Policy.Period is %v: the shortest is %v", p.Period, MinPeriod)
	case p.Tolerance < 0:
		return invalid("Policy.Tolerance is %v: it must not be negative", p.Tolerance)
	case p.Tolerance > 0 && p.Period == 0:
		return invalid("Policy.Tolerance is %v but Period is zero: a tolerance places a run in a slot", p.Tolerance)
	case p.Period > 0 && 2*p.Tolerance >= p.Period:
		return invalid("Policy.Tolerance (%v) must be below half of Policy.Period (%v)", p.Tolerance, p.Period)
	case p.AtLeast < 0:
		return invalid("Policy.AtLeast is %v: it must not be negative", p.AtLeast)
	case p.AtMost < 0:
		return invalid("Policy.AtMost is %v: it must not be negative", p.AtMost)
	case p.AtMost > 0 && p.AtMost < lease.MinTTL:
		return invalid("Policy.AtMost is %v: a run's lease lasts at least lease.MinTTL (%v)", p.AtMost, lease.MinTTL)
	case p.TTL < 0:
		return invalid("Policy.TTL is %v: it must not be negative", p.TTL)
	case p.TTL > 0 && p.TTL < lease.MinTTL:
		return invalid("Policy.TTL is %v: a run's lease lasts at least lease.MinTTL (%v)", p.TTL, lease.MinTTL)
	case p.AtMost > 0 && p.TTL > 0:
		return invalid("Policy.AtMost (%v) and Policy.TTL (%v) are both set: a run's lease is taken for AtMost, unrenewed, or for TTL, renewed", p.AtMost, p.TTL)
	}
	return nil
}

// withDefaults returns p with its defaults filled in.
func (p Policy) withDefaults() Policy {
	if p.Tolerance == 0 && p.Period > 0 {
		p.Tolerance = min(DefaultTolerance, p.Period/4)
	}
	if p.TTL == 0 && p.AtMost == 0 {
		p.TTL = DefaultTTL
	}
	return p
}

// leaseTTL is the TTL of a run's lease, and whether it is kept alive.
func (p Policy) leaseTTL() (time.Duration, bool) {
	if p.AtMost > 0 {
		return p.AtMost, false
	}
	return p.TTL, true
}

func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.History == 0 {
		c.History = DefaultHistory
	}
	return c
}

// validate checks a Config with its defaults filled in.
func (c Config) validate() error {
	if err := c.validateTable(); err != nil {
		return err
	}
	switch {
	case c.Store == nil:
		return invalid("Config.Store is nil: runs hold leases (make one with lease.New)")
	case c.Pool == nil:
		return invalid("Config.Pool is nil: it reaches the run table")
	}
	return nil
}

// validateTable checks the fields that name the run table.
func (c Config) validateTable() error {
	if err := ident.Check(c.Schema); err != nil {
		return invalid("Config.Schema: %v", err)
	}
	if err := ident.Check(c.Table); err != nil {
		return invalid("Config.Table: %v", err)
	}
	if c.History < 1 || c.History > MaxHistory {
		return invalid("Config.History is %d: it must be between 1 and %d", c.History, MaxHistory)
	}
	return nil
}

// checkText checks a job name or a slot key (what): text the server can
// store, at most MaxJobLen bytes.
func checkText(what, s string) error {
	switch {
	case s == "":
		return invalid("%s is empty", what)
	case len(s) > MaxJobLen:
		return invalid("%s is %d bytes long: the longest is %d", what, len(s), MaxJobLen)
	case !utf8.ValidString(s):
		return invalid("%s %q is not valid UTF-8", what, s)
	case strings.IndexByte(s, 0) >= 0:
		return invalid("%s %q contains a NUL byte", what, s)
	}
	return nil
}

// invalid returns an error wrapping ErrInvalid, marked so that no retry
// is attempted.
func invalid(format string, args ...any) error {
	return outcome.MarkFatal(fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...))
}
