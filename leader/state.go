package leader

import (
	"context"
	"log/slog"
	"time"

	"github.com/pglocks/pglocks/internal/failrun"
)

// State is what an [Elector] reports about itself, for health checks and
// metrics: whether it runs and leads, until when its term is trusted, and
// the last error it met.
type State struct {
	// Running reports whether [Elector.Run] is under way.
	Running bool
	// Mode is the mode the elector campaigns in, as [Elector.Mode]
	// reports it: ModeLeaseOnly once an elector in ModeAuto has fallen
	// back to it behind a pooler in transaction mode.
	Mode Mode
	// Leading reports whether this candidate holds a term now.
	Leading bool
	// Term is the current term's number while Leading, else 0.
	Term int64
	// TrustedUntil is the current term's [Term.TrustedUntil] while Leading,
	// else the zero time. A leader whose TrustedUntil lies in the past is
	// stepping down: reading a passed deadline ends the term (see
	// [Term.TrustedUntil]), and so does State.
	TrustedUntil time.Time
	// LastError is the last error of a campaign, or a term's renewals
	// found overdue (see the package doc, Renewals), nil if there has
	// been none; LastErrorAt is when it happened. They are kept after
	// a later success: compare LastErrorAt with the last election to judge.
	LastError   error
	LastErrorAt time.Time
}

// State returns the elector's state now. It is cheap (no round trip) and
// safe to call from any goroutine, for instance from an HTTP health
// handler: a candidate that is Running, not Leading, with a recent
// LastError, cannot campaign.
func (e *Elector) State() State {
	if e == nil {
		return State{}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	s := State{Running: e.running, Mode: e.mode, LastError: e.lastErr, LastErrorAt: e.errAt}
	if t := e.current; t != nil {
		s.Leading, s.Term, s.TrustedUntil = true, t.term.Number, t.term.TrustedUntil()
	}
	return s
}

// setErr records err as the last error.
func (e *Elector) setErr(err error) {
	e.mu.Lock()
	e.lastErr, e.errAt = err, time.Now()
	e.mu.Unlock()
}

// reached records that a campaign step got an answer from the database.
func (e *Elector) reached() {
	e.mu.Lock()
	e.reachedAt = time.Now()
	e.mu.Unlock()
}

// answered records that the campaign's wait for the lock or the lease got
// an answer from the database (a try answered "held", or the election),
// which ends a run of campaign failures.
func (e *Elector) answered() {
	e.reached()
	e.recovered(&e.campaignFails, "leader: campaign reached the database again")
}

// failed records err, a failure that will be retried, as the last error
// and logs msg with it: at Warn when it begins a run of failures of its
// kind, else at Debug (see Config.Logger).
func (e *Elector) failed(run *failrun.Run, msg string, err error, attrs ...any) {
	e.setErr(err)
	level := run.Fail(time.Now())
	if level >= slog.LevelWarn {
		msg += "; further failures are logged at Debug until one succeeds"
	}
	e.cfg.Logger.Log(context.Background(), level, msg, append([]any{"election", e.cfg.Name, "err", err}, attrs...)...)
}

// recovered logs msg at Warn when a success ends a run of failures.
func (e *Elector) recovered(run *failrun.Run, msg string) {
	if n, d, ended := run.Succeed(time.Now); ended {
		e.cfg.Logger.Warn(msg, "election", e.cfg.Name, "failures", n, "failing_for", d.Round(time.Millisecond))
	}
}

// neverReached returns the last error recorded since began if no campaign
// step has reached the database since then, else nil.
func (e *Elector) neverReached(began time.Time) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lastErr == nil || e.errAt.Before(began) || !e.reachedAt.Before(began) {
		return nil
	}
	return e.lastErr
}
