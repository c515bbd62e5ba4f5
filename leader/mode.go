package leader

import (
	"context"
	"errors"
	"strconv"

	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/lease"
)

// Mode is how an [Elector] campaigns; see [Config.Mode].
type Mode int

const (
	// ModeAuto campaigns as ModeSession unless the Locker refuses session
	// locks because its pool reaches PostgreSQL through a pooler in
	// transaction mode ([advisory.ErrTransactionPooling]): then the
	// elector logs it once at Warn and campaigns as ModeLeaseOnly from then
	// on.
	ModeAuto Mode = iota
	// ModeSession gates the campaign with a session advisory lock, for a
	// failover within about Grace after a crash. Behind a pooler in
	// transaction mode, Run returns [advisory.ErrTransactionPooling].
	ModeSession
	// ModeLeaseOnly campaigns on the lease alone: no advisory lock, no
	// session to keep, so it works behind any pooler. A crashed leader is
	// replaced once its lease expires: within TTL of its last renewal plus
	// a poll (at most about 300ms behind a pooler in transaction mode,
	// where the lease Store polls; a release wakes the candidates at once
	// elsewhere).
	ModeLeaseOnly
)

// String returns "auto", "session" or "lease-only".
func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeSession:
		return "session"
	case ModeLeaseOnly:
		return leaseOnlyMark
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// leaseOnlyMark is recorded in the lease row's metadata (meta.Campaign) by
// a lease-only leader: a session-mode taker then waits for its lease to
// expire or be released, and never terminates a backend for it.
const leaseOnlyMark = "lease-only"

// Mode returns the mode the elector campaigns in: [ModeSession] or
// [ModeLeaseOnly] — or [ModeAuto] while an elector configured so has not
// found out yet (its first campaign does).
func (e *Elector) Mode() Mode {
	if e == nil {
		return ModeAuto
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mode
}

// settle records what a campaign in ModeAuto found: session locks work,
// or — err is advisory.ErrTransactionPooling — they never will, and the
// elector falls back to ModeLeaseOnly; then it reports true.
func (e *Elector) settle(err error) (fellBack bool) {
	if e.cfg.Mode != ModeAuto {
		return false
	}
	e.mu.Lock()
	switch {
	case err == nil && e.mode == ModeAuto:
		e.mode = ModeSession
	case errors.Is(err, advisory.ErrTransactionPooling) && e.mode != ModeLeaseOnly:
		e.mode, fellBack = ModeLeaseOnly, true
	}
	e.mu.Unlock()
	if fellBack {
		e.cfg.Logger.Warn("leader: the Locker's pool is behind a pooler in transaction mode, where session locks do not work: campaigning on the lease alone (failover after a crash within TTL)",
			"election", e.cfg.Name, "identity", e.cfg.Identity, "ttl", e.cfg.TTL)
	}
	return fellBack
}

// leaseWatching is the lease-only campaign: it acquires the lease, waiting
// while another candidate holds it — whatever its mode: the server hands
// the lease over only once it is released or expired — and, meanwhile,
// reports new leaders to OnNewLeader. It never breaks a lease and never
// terminates a session.
func (e *Elector) leaseWatching(ctx context.Context, hooks *dispatcher) (*lease.Lease, error) {
	opts := e.termOptions(nil)
	return watching(e, ctx, hooks, false, func(ctx context.Context) (*lease.Lease, error) {
		return e.cfg.Store.Acquire(ctx, e.leaseName, e.cfg.TTL, opts...)
	})
}
