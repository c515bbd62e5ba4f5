package shard

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pglocks/pglocks/internal/backoff"
	"github.com/pglocks/pglocks/internal/outcome"
	"github.com/pglocks/pglocks/lease"
)

// Member is one process's (or one goroutine's) membership in a group: it
// keeps its member row alive, computes its share of the shards from the
// live member list, takes the shard leases of its share and gives up the
// others. Make it with [New] and run it with [Member.Run]. Its methods are
// safe for concurrent use.
type Member struct {
	cfg  Config
	wake chan struct{} // a SetShards asks the loop to look again

	mu      sync.Mutex
	shards  []string
	gen     uint64 // bumped by SetShards
	running bool
	held    map[string]*lease.Lease // shard → its term's lease, while the term holds it
	// seen is the ownership of the last read of the group's rows (shard
	// → identity), last the last owner seen of each shard, and wanted the
	// shards of the target computed from them: the assignment's inputs,
	// for the membership under way.
	seen, last map[string]string
	wanted     map[string]bool
	// freeSince is when each shard was first read free in the run of
	// reads that found it free: one free for longer than TTL loses its
	// last owner (see forgetStale).
	freeSince map[string]time.Time
}

// New checks cfg and returns a Member. It does not touch the database.
func New(cfg Config) (*Member, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Member{cfg: cfg, wake: make(chan struct{}, 1), shards: cfg.Shards, held: map[string]*lease.Lease{}}, nil
}

// Identity returns the member's identity in its group ("" for a nil
// Member).
func (m *Member) Identity() string {
	if m == nil {
		return ""
	}
	return m.cfg.Identity
}

// memberPrefix is the prefix of the member rows' lease names.
func (m *Member) memberPrefix() string { return m.cfg.Group + "#m:" }

// shardLease is the lease name of shard s.
func (m *Member) shardLease(s string) string { return m.cfg.Group + "#s:" + s }

// SetShards changes the group's shard set, at once: the member gives up
// the shards that are no longer in it and takes its share of the new
// ones. Give every member of the group the same set. The rules are those of
// Config.Shards.
func (m *Member) SetShards(shards []string) error {
	if m == nil || m.wake == nil {
		return errors.New("shard: SetShards on a nil or zero Member")
	}
	s, err := checkShards(shards)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.shards = s
	m.gen++
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
	return nil
}

// Owned returns the shards this member holds now (their leases acquired,
// their functions started, their terms not ended, their leases' trust
// deadlines not passed), by name. It is a snapshot for inspection and
// tests, not a trust signal: a shard may be lost or given up the moment
// after. Only a term's own Context, and writes fenced with
// [Shard.Guard] or [Shard.Token], say whether the term still owns it.
func (m *Member) Owned() []string {
	if m == nil || m.held == nil {
		return nil
	}
	m.mu.Lock()
	held := maps.Clone(m.held)
	m.mu.Unlock()
	out := make([]string, 0, len(held))
	for s, l := range held {
		// A term's end unlists it at once when this member ends it; a
		// lease's trust deadline passed is seen here even if the
		// deadline's timer has not run yet (a stalled scheduler).
		if l.TrustedUntil(); l.Err() == nil {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

// Members returns the identities of the group's live members (those whose
// member row is held unexpired by the server clock), sorted. ctx bounds
// the query.
func (m *Member) Members(ctx context.Context) ([]string, error) {
	if m == nil || m.cfg.Store == nil {
		return nil, errors.New("shard: Members on a nil or zero Member")
	}
	if ctx == nil {
		return nil, errors.New("shard: Members: nil ctx")
	}
	infos, err := m.cfg.Store.ListPrefix(ctx, m.memberPrefix())
	if err != nil {
		return nil, fmt.Errorf("shard: list members of %q: %w", m.cfg.Group, err)
	}
	var ids []string
	for _, i := range infos {
		// Group has no '#': a name with this prefix is this group's
		// member row, and no other group's.
		if id, ok := strings.CutPrefix(i.Name, m.memberPrefix()); ok && i.Held {
			ids = append(ids, id)
		}
	}
	return ids, nil // ListPrefix orders by name
}

// Target returns the shards that member identity owns in the assignment
// this member computes when members are the group's live members: the
// rule applied to the ownership of its last read of the whole group (and
// to the last owner it saw of each shard), with its own shards as it
// holds them now. It is exposed for inspection and tests; it reads
// nothing. The order of members and any duplicates in it do not matter.
// Outside a membership (before Run's first read, after Run returned)
// every shard counts as free.
func (m *Member) Target(identity string, members []string) []string {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	shards, owners, last := m.shards, m.ownersLocked(), maps.Clone(m.last)
	m.mu.Unlock()
	return target(shards, identity, memberSet(members), owners, last)
}

// ownersLocked is the ownership this member knows, shard → identity: its
// last read, except for its own shards, which are those it holds now
// (some may have been taken or given up since the read) and those the
// read found its own that it still wants — a term just lost, whose row
// its own goroutine is releasing and taking again, so that a transient
// loss does not change the member's share. m.mu is held.
func (m *Member) ownersLocked() map[string]string {
	own := make(map[string]string, len(m.seen)+len(m.held))
	for s, id := range m.seen {
		if id != m.cfg.Identity || m.wanted[s] {
			own[s] = id
		}
	}
	for s := range m.held {
		own[s] = m.cfg.Identity
	}
	return own
}

// memberSet returns members sorted, without duplicates, in a new slice.
func memberSet(members []string) []string {
	return slices.Compact(slices.Sorted(slices.Values(members)))
}

// Run joins the group and runs fn for every shard the member comes to
// own, each in its own goroutine, with a Context cancelled when the member
// must give the shard up (cause [ErrReassigned]), the member leaves
// (cause [ErrLeft]) or the shard's lease is lost (the lease's cause); see
// [Shard]. The shard is held until then whether or not fn has returned,
// and released only after fn has returned: the next owner starts after
// this one's fn is done. fn must return soon after its ctx ends. A panic
// in fn is not recovered: like any goroutine's panic it ends the process
// (its rows then expire, as after a crash).
//
// Run returns when ctx ends, after leaving the group: every shard's
// Context is cancelled at once (cause ErrLeft); the member row is
// released, so that the others stop counting this member at their next
// read of the member list; each shard is released as soon as its fn has
// returned (possibly before the member row), and Run returns once all
// are. A member whose row is lost (renewals failed, a long pause)
// gives up all its shards and joins again, with backoff. Run returns an
// error that retrying cannot cure at once: [ErrIdentityInUse], a missing
// lease table or privilege, a closed Store (a Store closed under a running
// member leaves its rows to expire, as a crash does), [ErrRunning].
func (m *Member) Run(ctx context.Context, fn func(ctx context.Context, s Shard)) error {
	if m == nil || m.cfg.Store == nil {
		return errors.New("shard: Run on a nil or zero Member")
	}
	if ctx == nil || fn == nil {
		return errors.New("shard: Run: nil ctx or fn")
	}
	m.mu.Lock()
	if m.running {
		m.mu.Unlock()
		return ErrRunning
	}
	m.running = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.running = false
		m.mu.Unlock()
	}()
	var bo backoff.Backoff
	for {
		err := m.membership(ctx, fn)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrIdentityInUse) || errors.Is(err, lease.ErrClosed) || outcome.Of(err) == outcome.Fatal {
			return err
		}
		m.cfg.Logger.Warn("shard: membership ended, joining again", "group", m.cfg.Group, "member", m.cfg.Identity, "err", err)
		if bo.Wait(ctx) != nil {
			return nil
		}
	}
}

// membership is one membership: join, follow the member list, leave.
func (m *Member) membership(ctx context.Context, fn func(context.Context, Shard)) error {
	row, err := m.join(ctx)
	if err != nil {
		return err
	}
	// The owners' Contexts end with cause ErrLeft, not Run's ctx's own
	// (context.Canceled): they derive from a ctx that outlives Run's.
	octx, leave := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { leave(ErrLeft) })
	o := newOwners(octx, m, fn, row.Token())
	defer func() {
		stop()
		m.mu.Lock()
		m.seen, m.last, m.wanted, m.freeSince = nil, nil, nil, nil // the next membership reads afresh
		m.mu.Unlock()
		if ctx.Err() != nil || row.Context().Err() == nil {
			leave(ErrLeft)
		} else {
			leave(fmt.Errorf("%w: its member row was lost: %w", ErrLeft, context.Cause(row.Context())))
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.TTL)
		defer cancel()
		_ = row.Release(rctx)
		o.wait()
	}()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-row.Context().Done():
			return fmt.Errorf("shard: member row of %q lost: %w", m.cfg.Identity, context.Cause(row.Context()))
		case <-timer.C:
		case <-m.wake:
		}
		m.reconcile(ctx, row, o)
		timer.Reset(m.cfg.PollInterval)
	}
}
