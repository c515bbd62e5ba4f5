package leader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/internal/reach"
	"github.com/pglocks/pglocks/lease"
)

// campaign waits until this candidate holds the lease — and, but in
// ModeLeaseOnly, the advisory lock first — and returns the new tenure,
// already current: a Resign from now on reaches it.
func (e *Elector) campaign(ctx context.Context, hooks *dispatcher) (*tenure, error) {
	e.cfg.Logger.Debug("leader: campaigning", "election", e.cfg.Name, "identity", e.cfg.Identity, "mode", e.Mode())
	var (
		lk  *advisory.Lock
		ls  *lease.Lease
		err error
	)
	if e.Mode() != ModeLeaseOnly {
		lk, err = e.lockWatching(ctx, hooks)
		if e.settle(err) {
			err = nil // fell back to ModeLeaseOnly
		}
		if err != nil {
			return nil, err
		}
	}
	if lk != nil {
		if err := e.yield(ctx, lk); err != nil {
			return nil, err
		}
	}
	if lk == nil {
		ls, err = e.leaseWatching(ctx, hooks)
	} else if ls, err = e.takeLease(ctx, lk, time.Now()); err != nil {
		e.unlock(lk)
	}
	if err != nil {
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
			lapse:    newLapse(),
			pub:      &publisher{e: e, m: e.metaOf(lk)},
		},
		lock:   lk,
		lease:  ls,
		resign: make(chan struct{}),
		done:   make(chan struct{}),
	}
	e.answered()
	e.mu.Lock()
	e.current = t
	e.mu.Unlock()
	e.notify(ctx)
	return t, nil
}

// lockWatching takes the campaign's advisory lock, waiting as long as it
// takes, while watching the lease row (see watching): it breaks a stale
// leader's session unless NoTerminate.
func (e *Elector) lockWatching(ctx context.Context, hooks *dispatcher) (*advisory.Lock, error) {
	return watching(e, ctx, hooks, !e.cfg.NoTerminate, func(ctx context.Context) (*advisory.Lock, error) {
		return e.cfg.Locker.Lock(ctx, e.key)
	})
}

// watching runs wait — the campaign's wait for the lock or the lease,
// whose tries the server answers "held" while another candidate leads:
// each answer counts as reaching the database (see neverReached) — and
// meanwhile, every RetryInterval, reads the lease row: it reports new
// leaders to OnNewLeader, and, if terminate, it breaks a stale leader — one
// whose lease has expired by the server clock while its session still
// holds the advisory lock — by terminating that session. A read that fails
// for good (the table is missing, a privilege) ends the wait with that
// error.
func watching[T any](e *Elector, ctx context.Context, hooks *dispatcher, terminate bool, wait func(context.Context) (T, error)) (T, error) {
	lctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		var last Leader
		for sleep(lctx, e.jitter(e.cfg.RetryInterval)) {
			info, err := e.readTerm(lctx)
			if err == nil || errors.Is(err, lease.ErrNotFound) {
				_ = e.ensureCandidate(lctx) // taken (again) once the database answers
			}
			switch {
			case errors.Is(err, lease.ErrNotFound):
				e.reached()
				e.recovered(&e.readFails, "leader: read lease succeeded again")
				continue
			case err != nil && lctx.Err() == nil && fatal(err):
				cancel(fmt.Errorf("read the lease: %w", err))
				return
			case err != nil:
				if lctx.Err() == nil {
					e.failed(&e.readFails, "leader: read lease failed; retrying", err)
				}
				continue
			}
			e.reached()
			e.recovered(&e.readFails, "leader: read lease succeeded again")
			l := leaderFromInfo(e.cfg.Name, info)
			if l.Held && !sameTerm(l, last) && hooks != nil && e.cfg.OnNewLeader != nil {
				hooks.do(func() { e.cfg.OnNewLeader(l) })
			}
			if !l.Held && l.owner != [16]byte{} && terminate {
				e.breakStale(lctx, l, !sameTerm(l, last))
			}
			last = l
		}
	}()
	v, err := wait(reach.With(lctx, e.answered)) // a try answered "held" reached the database
	cause := context.Cause(lctx)
	cancel(nil)
	<-watched
	if err != nil {
		if ctx.Err() == nil && cause != nil {
			err = cause // the watcher's
		}
		return v, fmt.Errorf("leader: campaign %q: %w", e.cfg.Name, err)
	}
	return v, nil
}

// takeLease acquires the lease while holding the advisory lock. A lease
// still held is waited for (see outwait) and, once the holder's horizon has
// passed, broken — if it is still that holder's — and tried again. Each
// call is bounded (see stmt, termBound): a try cut short has an unknown
// outcome, which its Store cleans up, and the campaign fails and is
// retried.
func (e *Elector) takeLease(ctx context.Context, lk *advisory.Lock, lockedAt time.Time) (*lease.Lease, error) {
	opts := e.termOptions(lk)
	for {
		tctx, cancel := context.WithTimeout(ctx, e.termBound())
		ls, err := e.cfg.Store.TryAcquire(tctx, e.leaseName, e.cfg.TTL, opts...)
		cancel()
		if err == nil || !errors.Is(err, lease.ErrHeld) {
			return e.keep(ls, lk, err)
		}
		info, err := e.readTerm(ctx)
		if err != nil {
			return nil, err
		}
		if ls, err = e.outwait(ctx, lk, lockedAt, leaderFromInfo(e.cfg.Name, info), opts); ls != nil || err != nil {
			return ls, err
		}
	}
}

// outwait waits for holder's lease to be released or to expire (and then
// returns it acquired) — or, if the holder recorded a horizon, only until
// that has passed since lockedAt: the longer of our Grace and the Grace
// the holder recorded. Every holder that records one is a session-mode
// leader whose advisory session ended before lockedAt — or we would not
// hold the lock — so by then it has stopped trusting its term; outwait
// breaks the lease if the row still shows that very term (owner and
// token), and returns nil, nil to try again. A holder that recorded no
// horizon — a lease-only leader, whose lease is all it has, or an older
// version — is waited for until its lease expires or is released.
func (e *Elector) outwait(ctx context.Context, lk *advisory.Lock, lockedAt time.Time, holder Leader, opts []lease.Option) (*lease.Lease, error) {
	wctx, cancel := context.WithCancel(lk.Context())
	defer cancel()
	grace, known := holder.meta.horizon()
	if known {
		wctx, cancel = context.WithDeadline(wctx, lockedAt.Add(max(e.cfg.Grace, grace)))
		defer cancel()
	}
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	ls, err := e.cfg.Store.Acquire(wctx, e.leaseName, e.cfg.TTL, opts...)
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
	broken, err := e.breakTerm(ctx, holder)
	if err != nil {
		return nil, err
	}
	if broken {
		e.cfg.Logger.Info("leader: broke the lease of a leader whose session ended", "election", e.cfg.Name,
			"term", holder.Term, "waited", time.Since(lockedAt).Round(time.Millisecond))
	}
	return nil, nil
}

// termOptions are the options of a term's lease: the metadata of
// metadata(lk), and the Store's keep-alive, which renews the term with
// every other kept-alive lease of the Store (see Elector.renew).
func (e *Elector) termOptions(lk *advisory.Lock) []lease.Option {
	return []lease.Option{lease.WithMetadata(e.metadata(lk)), lease.WithKeepAlive()}
}

// metadata is what a leader records in the lease row: with lk, its
// session and horizon; without (lease-only), the mark that it has none.
func (e *Elector) metadata(lk *advisory.Lock) json.RawMessage {
	md, _ := json.Marshal(e.metaOf(lk))
	return md
}

func (e *Elector) metaOf(lk *advisory.Lock) meta {
	m := meta{Identity: e.cfg.Identity, TTL: e.cfg.TTL.String(), Margin: e.margin.String(), Value: e.value()}
	if lk == nil {
		m.Campaign = leaseOnlyMark
	} else {
		m.SessionPID, m.Grace = lk.PID(), e.cfg.Grace.String()
		m.Ping = e.cfg.Locker.Config().PingInterval.String()
	}
	return m
}

// keep returns the lease just acquired, unless the advisory lock was lost
// meanwhile: then it releases the lease and reports the loss.
func (e *Elector) keep(ls *lease.Lease, lk *advisory.Lock, err error) (*lease.Lease, error) {
	if err != nil || lk.Err() == nil {
		return ls, err
	}
	ctx, cancel := e.stmt(context.Background())
	defer cancel()
	_ = ls.Release(ctx)
	return nil, fmt.Errorf("leader: campaign %q: advisory lock lost while taking the lease: %w", e.cfg.Name, lk.Err())
}

// notify announces a change of leadership to observers.
func (e *Elector) notify(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	e.announce(ctx)
}

// announce is notify bounded by ctx alone.
func (e *Elector) announce(ctx context.Context) {
	if _, err := e.cfg.Pool.Exec(ctx, "select pg_notify($1, $2)", e.cfg.Channel, e.cfg.Name); err != nil {
		e.cfg.Logger.Debug("leader: notify", "election", e.cfg.Name, "err", err)
	}
}

// unlock releases the advisory lock with a fresh bounded context; a nil
// lk (a lease-only term) is none.
func (e *Elector) unlock(lk *advisory.Lock) {
	if lk == nil {
		return
	}
	ctx, cancel := e.stmt(context.Background())
	defer cancel()
	if err := lk.Unlock(ctx); err != nil && !errors.Is(err, advisory.ErrNotHeld) {
		e.cfg.Logger.Warn("leader: unlock", "election", e.cfg.Name, "err", err)
	}
}
