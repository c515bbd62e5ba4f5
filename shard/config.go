package shard

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/internal/deflog"
	"github.com/pglocks/pglocks/lease"
)

// Defaults of [Config].
const (
	DefaultTTL          = 15 * time.Second
	DefaultPollInterval = 2 * time.Second
	// MinPollInterval bounds Config.PollInterval below: a member reads the
	// member list at most 100 times a second.
	MinPollInterval = 10 * time.Millisecond
	// MaxNameLen bounds the length of Config.Group, of a shard's name and
	// of Config.Identity, in bytes, so that every lease name the group
	// makes stays within [lease.MaxNameLen].
	MaxNameLen = 300
)

var (
	// ErrInvalidConfig is wrapped by every error [New] and
	// [Member.SetShards] return about their input.
	ErrInvalidConfig = errors.New("shard: invalid config")
	// ErrIdentityInUse is wrapped by the error of [Member.Run] when the
	// member row of its identity is held by another live member (another
	// process, or another Member value, with the same Config.Identity).
	// A row found held is first waited for, as long as it has left plus
	// PollInterval: the row of a crashed process with this identity
	// expires meanwhile and Run joins. A row the same holder renewed
	// meanwhile is waited for once more (a renewal the crashed process
	// sent before it died can commit late); only a row still held after
	// that, or taken by another holder meanwhile, is refused: after at most
	// two of the holder's TTL plus PollInterval (and the statements' time)
	// from the join. A row held by the join's own attempt (one a deadline
	// cut off after it committed) is waited for as it is cleaned up.
	ErrIdentityInUse = errors.New("shard: member identity already in use")
	// ErrRunning is returned by [Member.Run] called while another Run of
	// the same Member is under way.
	ErrRunning = errors.New("shard: member already running")
)

// Config configures a [Member]. Group, Shards and Store are required;
// every other field has a documented default, and its zero value means
// that default.
type Config struct {
	// Group names the group. Members with the same Group on the same lease
	// table share its shards. It must pass [pglocks.ValidateName], be at
	// most MaxNameLen bytes and contain no '#': the group's leases are
	// named "<Group>#m:<identity>" (member rows) and "<Group>#s:<shard>"
	// (shards), and no other user of the table may take such names.
	Group string

	// Shards are the names of the group's shards: at least one, each
	// non-empty, valid as a lease name, at most MaxNameLen bytes, no two
	// alike. Every member of a group must be given the same set (change it
	// everywhere with [Member.SetShards]); members that disagree still
	// never share a shard, but may leave some unowned or unbalanced.
	Shards []string

	// Store holds the member row and the shard leases, and renews them in
	// its batched keep-alive. Give each process one Store, on a pool of
	// its own (not the one the shards' work uses, whose busy connections
	// would delay its reads, acquisitions and renewals); its table must
	// exist ([lease.Store.Migrate]). The Member does not close it.
	Store *lease.Store

	// Identity names this member in the group. Two live members with one
	// identity are refused ([ErrIdentityInUse]); a stable identity (a pod
	// name) restarting after a crash waits for its old row to expire
	// (see [ErrIdentityInUse]) and joins. Default: hostname, pid and a random suffix,
	// unique per Member.
	Identity string

	// TTL is the time to live of the member row and of every shard lease:
	// a member that dies without leaving has its shards taken over within
	// TTL + PollInterval, plus the time of the others' reads of the group,
	// planning and acquisitions (see the package doc). At least
	// [lease.MinTTL]. Default: 15s.
	TTL time.Duration

	// PollInterval is how often a member reads the group's rows — its
	// members and who owns each shard — to notice members that joined,
	// left or died and shards that were released. Default: 2s.
	PollInterval time.Duration

	// Logger receives the member's events (attributes group, member,
	// shard, token, err). Default: slog.Default(), Warn and above only.
	Logger *slog.Logger
}

// withDefaults checks cfg and fills in its defaults.
func (cfg Config) withDefaults() (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if err := checkName("Group", cfg.Group); err != nil {
		return bad("%v", err)
	}
	if strings.Contains(cfg.Group, "#") {
		// The group's lease names are "<Group>#m:…" and "<Group>#s:…":
		// group "g#m:x" would make member rows of group g.
		return bad("Group %q contains '#', which separates the group from the rest of its lease names", cfg.Group)
	}
	if cfg.Store == nil {
		return bad("Store is required")
	}
	shards, err := checkShards(cfg.Shards)
	if err != nil {
		return Config{}, err
	}
	cfg.Shards = shards
	if cfg.Identity == "" {
		cfg.Identity = defaultIdentity()
	}
	if err := checkName("Identity", cfg.Identity); err != nil {
		return bad("%v", err)
	}
	switch {
	case cfg.TTL == 0:
		cfg.TTL = DefaultTTL
	case cfg.TTL < lease.MinTTL:
		return bad("TTL %v is below the minimum %v", cfg.TTL, lease.MinTTL)
	}
	switch {
	case cfg.PollInterval == 0:
		cfg.PollInterval = DefaultPollInterval
	case cfg.PollInterval < MinPollInterval:
		return bad("PollInterval %v is below the minimum %v", cfg.PollInterval, MinPollInterval)
	}
	cfg.Logger = deflog.Or(cfg.Logger)
	return cfg, nil
}

// checkShards checks a shard set and returns a copy of it.
func checkShards(shards []string) ([]string, error) {
	if len(shards) == 0 {
		return nil, fmt.Errorf("%w: Shards is empty: a group needs at least one shard", ErrInvalidConfig)
	}
	seen := make(map[string]bool, len(shards))
	for i, s := range shards {
		if err := checkName(fmt.Sprintf("Shards[%d]", i), s); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
		}
		if seen[s] {
			return nil, fmt.Errorf("%w: Shards[%d]: shard %q appears twice", ErrInvalidConfig, i, s)
		}
		seen[s] = true
	}
	return append([]string(nil), shards...), nil
}

func checkName(field, name string) error {
	if err := pglocks.ValidateName(name); err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("%s is %d bytes, longer than %d", field, len(name), MaxNameLen)
	}
	return nil
}

// defaultIdentity is hostname-pid-random.
func defaultIdentity() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}
