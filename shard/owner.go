package shard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/internal/backoff"
	"github.com/pglocks/pglocks/internal/outcome"
	"github.com/pglocks/pglocks/lease"
)

var (
	// ErrReassigned is the cause of a shard's Context when its member
	// gives the shard up because the assignment moved it elsewhere (a
	// member joined or left, or the shard set changed). It wraps
	// context.Canceled.
	ErrReassigned = fmt.Errorf("shard: reassigned: %w", context.Canceled)
	// ErrLeft is the cause of a shard's Context when its member leaves the
	// group: Run's ctx ended, or the member row was lost (the cause then
	// wraps the row's loss too, and the member joins again). It wraps
	// context.Canceled.
	ErrLeft = fmt.Errorf("shard: member left the group: %w", context.Canceled)
)

// Shard is one term of ownership of a shard: the shard's lease, acquired
// with a fencing token of its own. It is what [Member.Run] passes to its
// function, with a Context cancelled when the term ends.
type Shard struct {
	// Name is the shard's name, as in Config.Shards.
	Name string
	// Token is the term's fencing token: greater than that of every
	// earlier term of the shard, whoever held it. Send it with writes to a
	// resource that refuses tokens lower than one it has seen.
	Token int64

	lease *lease.Lease
}

// Guard checks, inside the caller's transaction tx, that this term still
// holds the shard, and locks the shard's lease row until tx ends, so that
// writes made in tx commit only while the term is the shard's owner (see
// [lease.Lease.Guard]). Not held: an error wrapping [lease.ErrNotHeld];
// roll tx back. ctx bounds the statement.
func (s Shard) Guard(ctx context.Context, tx pgx.Tx) error {
	if err := s.lease.Guard(ctx, tx); err != nil {
		return fmt.Errorf("shard %q: %w", s.Name, err)
	}
	return nil
}

// Lease returns the shard's lease for this term (nil for the zero Shard):
// its TrustedUntil, Assert and Handle are there.
func (s Shard) Lease() *lease.Lease { return s.lease }

// owners runs one goroutine per shard the member wants.
type owners struct {
	ctx context.Context // the membership's: its end ends every owner
	m   *Member
	fn  func(context.Context, Shard)
	wg  sync.WaitGroup
	// want maps each wanted shard to the cancel of its goroutine's ctx.
	want map[string]context.CancelCauseFunc
	// meta is the shard leases' metadata: this membership's identity and
	// member row token, which the others read as the shard's owner.
	meta json.RawMessage
	// rest is the loop's memory of its last read of the whole group.
	rest rest
}

func newOwners(ctx context.Context, m *Member, fn func(context.Context, Shard), row int64) *owners {
	return &owners{ctx: ctx, m: m, fn: fn, want: map[string]context.CancelCauseFunc{}, meta: holderMeta(m.cfg.Identity, row)}
}

// set starts an owner for every shard of target not yet wanted and stops
// those of shards no longer in it.
func (o *owners) set(target []string) {
	keep := make(map[string]bool, len(target))
	for _, s := range target {
		keep[s] = true
		if o.want[s] == nil {
			sctx, cancel := context.WithCancelCause(o.ctx)
			o.want[s] = cancel
			o.wg.Go(func() { o.own(sctx, s) })
		}
	}
	for s, cancel := range o.want {
		if !keep[s] {
			cancel(ErrReassigned)
			delete(o.want, s)
		}
	}
}

// wait waits for every owner, once the membership's ctx has ended: every
// fn has returned and every shard is released when it returns.
func (o *owners) wait() {
	o.wg.Wait()
	for s, cancel := range o.want {
		cancel(nil)
		delete(o.want, s)
	}
}

// own acquires the shard, waiting while another member holds it (a
// release wakes it at once), holds it, and takes it again if the lease is
// lost while the shard is still wanted, until ctx ends.
func (o *owners) own(ctx context.Context, s string) {
	cfg := o.m.cfg
	var bo backoff.Backoff
	for ctx.Err() == nil {
		l, err := cfg.Store.Acquire(ctx, o.m.shardLease(s), cfg.TTL, lease.WithKeepAlive(), lease.WithMetadata(o.meta))
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if outcome.Of(err) == outcome.Fatal {
				cfg.Logger.Error("shard: cannot acquire", "group", cfg.Group, "shard", s, "err", err)
			} else {
				cfg.Logger.Warn("shard: acquire failed", "group", cfg.Group, "shard", s, "err", err)
			}
			_ = bo.Wait(ctx)
			continue
		}
		bo.Reset()
		o.hold(ctx, s, l)
	}
}

// hold runs fn for one term of shard s and releases the lease once the
// term ended and fn has returned.
func (o *owners) hold(ctx context.Context, s string, l *lease.Lease) {
	cfg := o.m.cfg
	tctx, cancel := context.WithCancelCause(l.Context())
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	o.m.setHeld(s, l, true)
	// Owned stops listing the shard as soon as the term ends, not once fn
	// returns: a lost lease may be someone else's once it expires.
	unlist := context.AfterFunc(tctx, func() { o.m.setHeld(s, l, false) })
	defer unlist()
	cfg.Logger.Debug("shard: acquired", "group", cfg.Group, "member", cfg.Identity, "shard", s, "token", l.Token())
	o.fn(tctx, Shard{Name: s, Token: l.Token(), lease: l})
	<-tctx.Done()
	o.m.setHeld(s, l, false)
	stop()
	cancel(nil)
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.TTL)
	defer rcancel()
	if err := l.Release(rctx); err != nil && !errors.Is(err, lease.ErrNotHeld) && !errors.Is(err, lease.ErrClosed) {
		cfg.Logger.Warn("shard: release failed", "group", cfg.Group, "shard", s, "err", err)
	}
	if ctx.Err() == nil {
		cfg.Logger.Warn("shard: lost", "group", cfg.Group, "member", cfg.Identity, "shard", s, "err", context.Cause(tctx))
	}
}

// setHeld records whether the term of shard s with lease l is held, for
// Owned; the end of an older term does not unlist a newer one.
func (m *Member) setHeld(s string, l *lease.Lease, held bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if held {
		m.held[s] = l
	} else if m.held[s] == l {
		delete(m.held, s)
	}
}
