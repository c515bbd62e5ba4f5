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
// lease, and returns the new tenure, already current: a Resign from now on
// reaches it.
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
	tctx, endTerm := termContext(lk, ls)
	t := &tenure{
		endTerm: endTerm,
		term: Term{
			Election: e.cfg.Name,
			Number:   ls.Token(),
			Identity: e.cfg.Identity,
			Since:    time.Now(),
			lease:    ls,
			lock:     lk,
			grace:    e.cfg.Grace,
			now:      e.storeNow,
			ctx:      tctx,
		},
		lock:   lk,
		lease:  ls,
		resign: make(chan struct{}),
		done:   make(chan struct{}),
	}
	e.mu.Lock()
	e.current = t
	e.mu.Unlock()
	e.notify(ctx)
	return t, nil
}

// lockWatching takes the campaign's advisory lock, waiting as long as it
// takes. Meanwhile, every RetryInterval, it reads the lease row: it reports
// new leaders to OnNewLeader, and it breaks a stale leader — one whose lease
// has expired by the server clock while its session still holds the
// advisory lock — by terminating that session (unless NoTerminate). A read
// that fails for good (the table is missing, a privilege) ends the wait
// with that error.
func (e *Elector) lockWatching(ctx context.Context, hooks *dispatcher) (*advisory.Lock, error) {
	lctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		var last Leader
		for sleep(lctx, e.jitter(e.cfg.RetryInterval)) {
			info, err := e.cfg.Store.Get(lctx, e.leaseName)
			switch {
			case errors.Is(err, lease.ErrNotFound):
				continue
			case err != nil && lctx.Err() == nil && fatal(err):
				cancel(fmt.Errorf("read the lease: %w", err))
				return
			case err != nil:
				if lctx.Err() == nil {
					e.setErr(err)
					e.cfg.Logger.Warn("leader: read lease failed; retrying", "election", e.cfg.Name, "err", err)
				}
				continue
			}
			l := leaderFromInfo(e.cfg.Name, info)
			if l.Held && !sameTerm(l, last) && hooks != nil && e.cfg.OnNewLeader != nil {
				hooks.do(func() { e.cfg.OnNewLeader(l) })
			}
			if !l.Held && l.owner != [16]byte{} && !e.cfg.NoTerminate {
				e.breakStale(lctx, l, !sameTerm(l, last))
			}
			last = l
		}
	}()
	lk, err := e.cfg.Locker.Lock(lctx, e.key)
	cause := context.Cause(lctx)
	cancel(nil)
	<-watched
	if err != nil {
		if ctx.Err() == nil && cause != nil {
			err = cause // the watcher's
		}
		return nil, fmt.Errorf("leader: campaign %q: %w", e.cfg.Name, err)
	}
	return lk, nil
}

// takeLease acquires the lease while holding the advisory lock. A lease
// still held by the previous leader — whose advisory session has ended, or
// we would not hold the lock — is waited for (a release ends the wait at
// once) until the holder's horizon has passed since lockedAt: the longer of
// our Grace and the Grace the holder recorded in the row. Then it is
// broken and taken over: by then the previous leader has stopped trusting
// its session, so it no longer leads. A holder that recorded no horizon is
// waited for until its lease expires.
func (e *Elector) takeLease(ctx context.Context, lk *advisory.Lock, lockedAt time.Time) (*lease.Lease, error) {
	md, _ := json.Marshal(meta{Identity: e.cfg.Identity, SessionPID: lk.PID(),
		Grace: e.cfg.Grace.String(), Ping: e.cfg.Locker.Config().PingInterval.String(),
		TTL: e.cfg.TTL.String(), Margin: e.margin.String()})
	opt := lease.WithMetadata(md)
	ls, err := e.cfg.Store.TryAcquire(ctx, e.leaseName, e.cfg.TTL, opt)
	if err == nil || !errors.Is(err, lease.ErrHeld) {
		return e.keep(ls, lk, err)
	}
	info, err := e.cfg.Store.Get(ctx, e.leaseName)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(lk.Context())
	defer cancel()
	holder, known := leaderFromInfo(e.cfg.Name, info).meta.horizon()
	if known {
		wctx, cancel = context.WithDeadline(wctx, lockedAt.Add(max(e.cfg.Grace, holder)))
		defer cancel()
	}
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	ls, err = e.cfg.Store.Acquire(wctx, e.leaseName, e.cfg.TTL, opt)
	switch {
	case err == nil:
		return e.keep(ls, lk, nil)
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
	e.cfg.Logger.Info("leader: took over the lease of a leader whose session ended", "election", e.cfg.Name,
		"waited", time.Since(lockedAt).Round(time.Millisecond))
	ls, err = e.cfg.Store.TryAcquire(ctx, e.leaseName, e.cfg.TTL, opt)
	return e.keep(ls, lk, err)
}

// keep returns the lease just acquired, unless the advisory lock was lost
// meanwhile: then it releases the lease and reports the loss.
func (e *Elector) keep(ls *lease.Lease, lk *advisory.Lock, err error) (*lease.Lease, error) {
	if err != nil || lk.Err() == nil {
		return ls, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RetryInterval+5*time.Second)
	defer cancel()
	_ = ls.Release(ctx)
	return nil, fmt.Errorf("leader: campaign %q: advisory lock lost while taking the lease: %w", e.cfg.Name, lk.Err())
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
