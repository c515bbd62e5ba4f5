package leader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglocks/pglocks/advisory"
)

var (
	// ErrHandedOver is the cause of a leader's context after
	// [Elector.HandOver] (or a hand-over asked for by [RequestHandOver] or
	// made by Config.HandOverOnClose). It wraps [ErrResigned].
	ErrHandedOver = fmt.Errorf("%w: handed over", ErrResigned)
	// ErrNotLeader is returned by [Elector.HandOver] when this candidate
	// does not lead.
	ErrNotLeader = errors.New("leader: not the leader")
	// ErrNoCandidate is returned when a hand-over names no live candidate
	// other than the leader (see [Candidates]): the leader keeps leading.
	ErrNoCandidate = errors.New("leader: no such live candidate")
	// ErrNoLeader is returned by [RequestResign] and [RequestHandOver]
	// when the election has no leader now.
	ErrNoLeader = errors.New("leader: the election has no leader")
)

// errYielded ends a campaign that found the lease reserved for another
// candidate by a hand-over: Run campaigns again at once.
var errYielded = errors.New("leader: yielded to a hand-over's target")

// HandOver hands this leader's term over to the live candidate named to
// (its Config.Identity), or if to is "" to the other live candidate that
// joined last (the newest JoinedAt: in a rolling deploy, a new pod): the
// leader's work sees its context cancelled with [ErrHandedOver]; once it
// has returned, the leader records the target in its lease row, releases
// the lease and unlocks, and the target takes the next term at once — it
// is woken by the release, and for a window of 2 × RetryInterval from when
// another candidate first sees the reservation, every other candidate
// leaves the term to it. Terms stay fenced: the next term has a higher
// number, and [Term.Guard] refuses the old one's writes once its lease is
// released. HandOver returns once this leader has stepped down, or ctx
// ends. A target that is unknown, dead (its candidate row expired) or this
// candidate itself gives an error wrapping [ErrNoCandidate], and a
// candidate that does not lead [ErrNotLeader]: the leader keeps leading.
// A target that dies during the hand-over delays the next term by at most
// the window. HandOver returns an error wrapping [ErrResigned] if the
// term was already ending by a resignation or another hand-over. In
// ModeLeaseOnly no target is recorded (lease-only candidates do not
// yield): it is a resignation, and any waiting candidate may win.
// Candidates of a version without hand-over do not yield either: in a
// mixed-version rolling deploy the target may lose the race to one.
func (e *Elector) HandOver(ctx context.Context, to string) error {
	if err := e.usable(); err != nil {
		return fmt.Errorf("leader: hand over: %w", err)
	}
	if ctx == nil {
		return fmt.Errorf("leader: hand over %q: nil context", e.cfg.Name)
	}
	e.mu.Lock()
	t := e.current
	e.mu.Unlock()
	if t == nil {
		return fmt.Errorf("leader: hand over %q: %w", e.cfg.Name, ErrNotLeader)
	}
	target, err := e.pickTarget(ctx, to)
	if err != nil {
		return fmt.Errorf("leader: hand over %q: %w", e.cfg.Name, err)
	}
	won := false
	t.once.Do(func() { t.why, t.handTo, won = ErrHandedOver, target, true; close(t.resign) })
	if !won {
		return fmt.Errorf("leader: hand over %q: the term was already ending, not handed over: %w", e.cfg.Name, t.why)
	}
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("leader: hand over %q: %w", e.cfg.Name, context.Cause(ctx))
	}
}

// pickTarget returns the live candidate to hand over to: to, or for ""
// the live candidate other than this one that joined last — in a rolling
// deploy, a pod of the new version rather than an old one about to stop.
func (e *Elector) pickTarget(ctx context.Context, to string) (string, error) {
	cs, err := Candidates(ctx, e.cfg.Store, e.cfg.Name)
	if err != nil {
		return "", err
	}
	return chooseTarget(cs, e.cfg.Identity, to)
}

func chooseTarget(cs []Candidate, self, to string) (string, error) {
	if to == self && to != "" {
		return "", fmt.Errorf("%w: %q is the leader itself", ErrNoCandidate, to)
	}
	var best *Candidate
	for i := range cs {
		c := &cs[i]
		switch {
		case c.Identity == self:
		case to != "" && c.Identity == to:
			return to, nil
		case to == "" && (best == nil || c.JoinedAt.After(best.JoinedAt)):
			best = c
		}
	}
	if best == nil {
		if to == "" {
			return "", fmt.Errorf("%w: no candidate but the leader runs", ErrNoCandidate)
		}
		return "", fmt.Errorf("%w: %q (unknown, or its candidate row expired)", ErrNoCandidate, to)
	}
	return best.Identity, nil
}

// reserve records, in the term's lease row, the candidate the term is
// handed to — t.handTo, or with Config.HandOverOnClose any other live
// candidate when Run's ctx ended — just before the step-down releases it.
// A failure leaves a plain resignation (logged).
func (e *Elector) reserve(t *tenure, reason error) {
	to := t.handTo
	if to == "" && !(e.cfg.HandOverOnClose && errors.Is(reason, ErrStopped)) {
		return
	}
	if t.lock == nil {
		return // a lease-only campaign does not yield: nothing would honour it
	}
	if t.lease.Err() != nil || !time.Now().Before(t.term.TrustedUntil()) {
		return
	}
	ctx, cancel := e.stmt(context.Background())
	defer cancel()
	if to == "" {
		var err error
		if to, err = e.pickTarget(ctx, ""); err != nil {
			e.cfg.Logger.Info("leader: no hand-over on stop", "election", e.cfg.Name, "err", err)
			return
		}
	}
	if err := t.term.pub.set(ctx, t.lease, func(m *meta) { m.HandOverTo = to }); err != nil {
		e.cfg.Logger.Warn("leader: hand-over: could not record the target; resigning", "election", e.cfg.Name, "to", to, "err", err)
		return
	}
	e.cfg.Logger.Info("leader: handing over", "election", e.cfg.Name, "term", t.term.Number, "to", to)
}

// reservation is the last hand-over reservation a campaign saw: the
// released term that recorded it, its target, and when it was first seen.
type reservation struct {
	term  int64
	to    string
	first time.Time
}

// yield is the campaign's check, holding the advisory lock lk, that the
// lease is not reserved for another candidate by a hand-over: if it is,
// and the window (2 × RetryInterval from when this candidate first saw the
// reservation) is open, it unlocks, waits until a later term begins or the
// window closes, and returns errYielded. A failed read does not hold the
// campaign back: the reservation is about who leads next, never safety.
func (e *Elector) yield(ctx context.Context, lk *advisory.Lock) error {
	info, err := e.readTerm(ctx)
	if err != nil {
		return nil
	}
	l := leaderFromInfo(e.cfg.Name, info)
	to := l.meta.HandOverTo
	if l.Held || to == "" || to == e.cfg.Identity {
		return nil
	}
	if e.resv.term != l.Term || e.resv.to != to {
		e.resv = reservation{term: l.Term, to: to, first: time.Now()}
	}
	end := e.resv.first.Add(2 * e.cfg.RetryInterval)
	if !time.Now().Before(end) {
		return nil
	}
	e.unlock(lk)
	wctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	for sleep(wctx, e.jitter(min(e.cfg.RetryInterval, 20*time.Millisecond))) {
		if i, err := e.cfg.Store.Get(wctx, e.leaseName); err == nil && i.Token != l.Term {
			break
		}
	}
	return errYielded
}

// answerRequest is called by tend when a leader's candidate row was lost:
// a request to resign or hand over (see [RequestResign]) breaks it. It
// reads the request for this term and, if there is one, ends the term as
// Resign or HandOver would (the watch sees t.resign); no request (the row
// was lost for another reason), or a hand-over with no live target,
// changes nothing. It reports whether it found a request, and whether
// the term is ending (by this request, or by whatever ended it first).
// Its calls are bounded by ctx; an unknown outcome of the read is no
// request.
func (e *Elector) answerRequest(rctx context.Context, t *tenure) (asked, ending bool) {
	r, info, ok := readRequest(rctx, e.cfg.Store, e.cfg.Name, t.term.Number)
	if !ok {
		return false, false
	}
	if r.Action == actionResign {
		e.cfg.Logger.Info("leader: resigning on request", "election", e.cfg.Name, "term", t.term.Number, "from", r.From)
		t.once.Do(func() { t.why = fmt.Errorf("%w: asked by %s", ErrResigned, r.From); close(t.resign) })
		return true, true
	}
	to, err := e.pickTarget(rctx, r.To)
	if err != nil {
		e.cfg.Logger.Warn("leader: hand-over request refused; leading on", "election", e.cfg.Name, "from", r.From, "err", err)
		// Tell the requester: it waits for the request's row to change.
		_, _ = e.cfg.Store.BreakAcquisition(rctx, info.Name, info.Owner, info.Token)
		return true, false
	}
	e.cfg.Logger.Info("leader: handing over on request", "election", e.cfg.Name, "term", t.term.Number, "to", to, "from", r.From)
	t.once.Do(func() {
		t.why, t.handTo = fmt.Errorf("%w: to %q, asked by %s", ErrHandedOver, to, r.From), to
		close(t.resign)
	})
	return true, true
}
