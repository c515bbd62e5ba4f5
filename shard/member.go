package shard

import (
	"context"
	"errors"
	"fmt"
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
	held    map[string]int64 // shard → token, while its fn may run
}

// New checks cfg and returns a Member. It does not touch the database.
func New(cfg Config) (*Member, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Member{cfg: cfg, wake: make(chan struct{}, 1), shards: cfg.Shards, held: map[string]int64{}}, nil
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
// their functions started, their terms not ended), by name. It is a snapshot for inspection
// and tests, not a trust signal: a shard may be lost or given up the
// moment after. Only a term's own Context, and writes fenced with
// [Shard.Guard] or [Shard.Token], say whether the term still owns it.
func (m *Member) Owned() []string {
	if m == nil || m.held == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.held))
	for s := range m.held {
		out = append(out, s)
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

// Target returns the shards that member identity owns when members are
// the group's live members: the assignment every member computes for
// itself, exposed for inspection and tests. It reads nothing. The order of
// members and any duplicates in it do not matter.
func (m *Member) Target(identity string, members []string) []string {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	shards := m.shards
	m.mu.Unlock()
	return target(shards, identity, memberSet(members))
}

// memberSet returns members sorted, without duplicates, in a new slice.
func memberSet(members []string) []string {
	return slices.Compact(slices.Sorted(slices.Values(members)))
}

// target is Target for a member set (sorted, no duplicates).
func target(shards []string, identity string, members []string) []string {
	var out []string
	for i, j := range assign(shards, members) {
		if j >= 0 && members[j] == identity {
			out = append(out, shards[i])
		}
	}
	return out
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
	o := newOwners(octx, m, fn)
	defer func() {
		stop()
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

// reconcile reads the member list and makes the running owners match this
// member's share. A failed read changes nothing.
func (m *Member) reconcile(ctx context.Context, row *lease.Lease, o *owners) {
	members, err := m.readMembers(ctx, row)
	if err != nil {
		if ctx.Err() == nil {
			m.cfg.Logger.Warn("shard: cannot read the member list", "group", m.cfg.Group, "member", m.cfg.Identity, "err", err)
		}
		return
	}
	// Our row is live (we hold its lease); if the list lacks it, it was
	// read before the server saw it, or it renewed late. Count ourselves in.
	members = memberSet(append(members, m.cfg.Identity))
	m.mu.Lock()
	shards, gen := m.shards, m.gen
	m.mu.Unlock()
	if !o.cached || o.gen != gen || !slices.Equal(o.members, members) {
		// The assignment changes only with the member or the shard set.
		o.target = target(shards, m.cfg.Identity, members)
		o.cached, o.gen, o.members = true, gen, members
	}
	o.set(o.target)
}

// readMembers reads the member list within TTL/3, and gives up at once if
// the member row is lost meanwhile: a read whose reply never comes (a
// lost packet, a half-open connection) must not keep the loop from
// noticing the loss or from reading again.
func (m *Member) readMembers(ctx context.Context, row *lease.Lease) ([]string, error) {
	rctx, cancel := context.WithTimeout(ctx, m.cfg.TTL/3)
	defer cancel()
	stop := context.AfterFunc(row.Context(), cancel)
	defer stop()
	return m.Members(rctx)
}

// join acquires the member row. A row of this identity found held is
// waited for, as long as it has left plus PollInterval: a crashed
// predecessor's row expires by then, and a release still in flight (an
// earlier membership of this Member) wakes the wait at once. A row still
// held after that was renewed, or taken again, meanwhile: another live
// member has this identity, and the error wraps [ErrIdentityInUse]. Each
// statement is bounded by TTL.
func (m *Member) join(ctx context.Context) (*lease.Lease, error) {
	name := m.memberPrefix() + m.cfg.Identity
	try := func() (*lease.Lease, error) {
		tctx, cancel := context.WithTimeout(ctx, m.cfg.TTL)
		defer cancel()
		return m.cfg.Store.TryAcquire(tctx, name, m.cfg.TTL, lease.WithKeepAlive())
	}
	row, err := try()
	var held *lease.HeldError
	if errors.As(err, &held) {
		wait := held.ExpiresIn + m.cfg.PollInterval
		m.cfg.Logger.Info("shard: member row of this identity is held; waiting for its release or expiry",
			"group", m.cfg.Group, "member", m.cfg.Identity, "expires_in", held.ExpiresIn)
		wctx, cancel := context.WithTimeout(ctx, wait)
		row, err = m.cfg.Store.Acquire(wctx, name, m.cfg.TTL, lease.WithKeepAlive())
		cancel()
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			row, err = try()
		}
	}
	if errors.As(err, &held) {
		return nil, fmt.Errorf("%w: group %q, identity %q: its member row is still held, renewed after it was due to expire",
			ErrIdentityInUse, m.cfg.Group, m.cfg.Identity)
	}
	if err != nil {
		return nil, fmt.Errorf("shard: join group %q: %w", m.cfg.Group, err)
	}
	return row, nil
}
