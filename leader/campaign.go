package leader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/lease"
)

// campaign waits until this candidate holds both the advisory lock and the
// lease, and returns the new tenure.
func (e *Elector) campaign(ctx context.Context, hooks *dispatcher) (*tenure, error) {
	e.cfg.Logger.Debug("leader: campaigning", "election", e.cfg.Name, "identity", e.cfg.Identity)
	lk, err := e.lockWatching(ctx, hooks)
	if err != nil {
		return nil, err
	}
	lockedAt := time.Now()
	ls, err := e.takeLease(ctx, lk, lockedAt)
	if err != nil {
		e.unlock(lk)
		return nil, err
	}
	t := &tenure{
		term: Term{
			Election: e.cfg.Name,
			Number:   ls.Token(),
			Identity: e.cfg.Identity,
			Since:    time.Now(),
			lease:    ls,
			lock:     lk,
			grace:    e.cfg.Grace,
		},
		lock:   lk,
		lease:  ls,
		resign: make(chan struct{}),
		done:   make(chan struct{}),
	}
	e.notify(ctx)
	return t, nil
}

// lockWatching takes the campaign's advisory lock, waiting as long as it
// takes. Meanwhile, every RetryInterval, it reads the lease row: it reports
// new leaders to OnNewLeader, and it breaks a stale leader — one whose lease
// has expired by the server clock while its session still holds the
// advisory lock — by terminating that session (unless NoTerminate).
func (e *Elector) lockWatching(ctx context.Context, hooks *dispatcher) (*advisory.Lock, error) {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		var last Leader
		for sleep(lctx, e.jitter(e.cfg.RetryInterval)) {
			info, err := e.cfg.Store.Get(lctx, e.leaseName)
			if errors.Is(err, lease.ErrNotFound) {
				continue
			}
			if err != nil {
				e.cfg.Logger.Debug("leader: read lease", "election", e.cfg.Name, "err", err)
				continue
			}
			l := leaderFromInfo(e.cfg.Name, info)
			if l.Held && !sameTerm(l, last) && hooks != nil && e.cfg.OnNewLeader != nil {
				hooks.do(func() { e.cfg.OnNewLeader(l) })
			}
			last = l
			if !l.Held && l.owner != [16]byte{} && !e.cfg.NoTerminate {
				e.breakStale(lctx, l)
			}
		}
	}()
	lk, err := e.cfg.Locker.Lock(ctx, e.key)
	cancel()
	<-watched
	if err != nil {
		return nil, fmt.Errorf("leader: campaign %q: %w", e.cfg.Name, err)
	}
	return lk, nil
}

// breakStale terminates the session of a leader whose lease expired (not
// released: its owner is still set) if that very session still holds the
// advisory lock. The leader stopped trusting its lease before the expiry,
// so it no longer acts as leader; its session merely blocks the election.
func (e *Elector) breakStale(ctx context.Context, stale Leader) {
	if stale.sessionPID == 0 {
		return
	}
	classid, objid, objsubid := e.key.LockTag()
	var terminated bool
	err := e.cfg.Pool.QueryRow(ctx, `
		with h as materialized (
			select pid from pg_locks
			where locktype = 'advisory' and granted and pid = $4
			  and database = (select oid from pg_database where datname = current_database())
			  and classid = $1 and objid = $2 and objsubid = $3)
		select coalesce(bool_or(pg_terminate_backend(pid)), false) from h`,
		classid, objid, objsubid, int32(stale.sessionPID)).Scan(&terminated)
	switch {
	case err != nil:
		e.cfg.Logger.Warn("leader: cannot terminate a stale leader's session; waiting for the server to drop it",
			"election", e.cfg.Name, "stale", stale.Identity, "pid", stale.sessionPID, "err", err)
	case terminated:
		e.cfg.Logger.Info("leader: terminated a stale leader's session",
			"election", e.cfg.Name, "stale", stale.Identity, "term", stale.Term, "pid", stale.sessionPID)
	}
}

// takeLease acquires the lease while holding the advisory lock. A lease
// still held by the previous leader — whose advisory session has ended, or
// we would not hold the lock — is waited for until Grace after lockedAt
// (a release wakes us at once), then broken and taken over: by then the
// previous leader has stopped trusting its session, so it no longer leads.
func (e *Elector) takeLease(ctx context.Context, lk *advisory.Lock, lockedAt time.Time) (*lease.Lease, error) {
	md, _ := json.Marshal(meta{Identity: e.cfg.Identity, SessionPID: lk.PID()})
	opt := lease.WithMetadata(md)
	ls, err := e.cfg.Store.TryAcquire(ctx, e.leaseName, e.cfg.TTL, opt)
	if err == nil || !errors.Is(err, lease.ErrHeld) {
		return ls, err
	}
	// Wait for a release until the grace ends, or the lock is lost.
	wctx, cancel := context.WithDeadline(lk.Context(), lockedAt.Add(e.cfg.Grace))
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	ls, err = e.cfg.Store.Acquire(wctx, e.leaseName, e.cfg.TTL, opt)
	switch {
	case err == nil:
		return ls, nil
	case ctx.Err() != nil:
		return nil, context.Cause(ctx)
	case lk.Context().Err() != nil:
		return nil, fmt.Errorf("leader: campaign %q: advisory lock lost while taking the lease: %w", e.cfg.Name, lk.Err())
	case !errors.Is(err, context.DeadlineExceeded):
		return nil, err
	}
	if _, err := e.cfg.Store.Break(ctx, e.leaseName); err != nil {
		return nil, err
	}
	e.cfg.Logger.Info("leader: took over the lease of a leader whose session ended", "election", e.cfg.Name)
	return e.cfg.Store.TryAcquire(ctx, e.leaseName, e.cfg.TTL, opt)
}

// notify announces a change of leadership to observers.
func (e *Elector) notify(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := e.cfg.Pool.Exec(ctx, "select pg_notify($1, $2)", e.cfg.Channel, e.cfg.Name); err != nil {
		e.cfg.Logger.Debug("leader: notify", "election", e.cfg.Name, "err", err)
	}
}

// unlock releases the advisory lock with a fresh bounded context.
func (e *Elector) unlock(lk *advisory.Lock) {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RetryInterval+5*time.Second)
	defer cancel()
	if err := lk.Unlock(ctx); err != nil && !errors.Is(err, advisory.ErrNotHeld) {
		e.cfg.Logger.Warn("leader: unlock", "election", e.cfg.Name, "err", err)
	}
}
