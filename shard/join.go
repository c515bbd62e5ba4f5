package shard

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/pglocks/pglocks/lease"
)

// join acquires the member row, under one owner id for all its attempts,
// so that a row held by that id is known to be join's own: an attempt
// whose statement a deadline cut off after it committed, being cleaned up
// in the background. Such a row is waited for, and does not count.
//
// A row of this identity held by anyone else is waited for as long as it
// has left plus PollInterval: a crashed predecessor's row expires by then,
// and a release still in flight (an earlier membership of this Member)
// wakes the wait at once. A row the same holder (owner and token) renewed
// meanwhile is waited for once more: a renewal a crashed predecessor sent
// before it died can commit after join's read. A row still held by that
// holder after the second wait, or taken by another holder meanwhile, is
// another live member's with this identity, and the error wraps
// [ErrIdentityInUse]. Each statement is bounded by TTL; each wait by the
// holder's time left plus PollInterval.
func (m *Member) join(ctx context.Context) (*lease.Lease, error) {
	name := m.memberPrefix() + m.cfg.Identity
	own := uuid.New()
	try := func() (*lease.Lease, error) {
		tctx, cancel := context.WithTimeout(ctx, m.cfg.TTL)
		defer cancel()
		return m.cfg.Store.TryAcquire(tctx, name, m.cfg.TTL, lease.WithKeepAlive(), lease.WithOwner(own))
	}
	row, err := try()
	var held, first *lease.HeldError
	waits, ownWaits := 0, 0
	for errors.As(err, &held) && ctx.Err() == nil {
		switch {
		case held.Owner == own:
			if ownWaits++; ownWaits > 3 {
				return nil, fmt.Errorf("shard: join group %q: the member row stays held by this join's own attempt, whose outcome was unknown", m.cfg.Group)
			}
		case first == nil:
			first = held
			waits++
		case held.Owner != first.Owner || held.Token != first.Token:
			return nil, m.inUse("taken by another holder while this member waited for it", held)
		case waits == 2:
			return nil, m.inUse("renewed by its holder through two waits for its expiry", held)
		default:
			waits++
		}
		m.cfg.Logger.Info("shard: member row of this identity is held; waiting for its release or expiry",
			"group", m.cfg.Group, "member", m.cfg.Identity, "expires_in", held.ExpiresIn,
			"holder", held.Owner, "token", held.Token, "own_attempt", held.Owner == own)
		wctx, cancel := context.WithTimeout(ctx, held.ExpiresIn+m.cfg.PollInterval)
		row, err = m.cfg.Store.Acquire(wctx, name, m.cfg.TTL, lease.WithKeepAlive(), lease.WithOwner(own))
		cancel()
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			row, err = try()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("shard: join group %q: %w", m.cfg.Group, err)
	}
	return row, nil
}

// inUse is the error for a member row of this identity held by another
// live member: why join concluded so, and the holder.
func (m *Member) inUse(why string, held *lease.HeldError) error {
	return fmt.Errorf("%w: group %q, identity %q: its member row was %s (holder %s, token %d, %v left)",
		ErrIdentityInUse, m.cfg.Group, m.cfg.Identity, why, held.Owner, held.Token, held.ExpiresIn)
}
