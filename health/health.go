// Package health reports the health of a leader election over HTTP, in the
// spirit of client-go's HealthzAdaptor, for liveness and readiness probes.
//
// [Checker.Check] reads [leader.Elector.State] (no round trip, safe at any
// rate) and reports a candidate unhealthy when:
//
//   - it believes it leads but its term's trust deadline passed more than
//     Tolerance ago: it has not stepped down in time — a stalled process,
//     or a step-down stuck on an unreachable database — and may act on a
//     term that another candidate can take over;
//   - Run is not under way: it has returned (a fatal error, or its ctx
//     ended) or was never started;
//   - it is not leading and its campaign failed within FailingFor: it
//     cannot currently campaign (database unreachable, no privilege, no
//     table).
//
// With RequireLeader (readiness by leadership, opt-in) a candidate that is
// not the leader is also reported, so that only the leader receives
// traffic.
//
// What it does not check: that the database agrees (use [leader.Term.Guard]
// for that), nor the health of Lockers and Stores used outside the
// election. A leader that has stepped down after losing its term and
// campaigns again without errors is healthy: a follower.
package health

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/pglocks/pglocks/leader"
)

// Checker checks one elector. Its zero fields take their defaults; a
// Checker is safe for concurrent use and serves HTTP itself.
type Checker struct {
	// Elector is the election to check. Required.
	Elector *leader.Elector

	// Tolerance is how long after the trust deadline a leader that has
	// not stepped down is still reported healthy. Default: 0.
	Tolerance time.Duration

	// FailingFor is how recent a campaign error must be for a candidate
	// that does not lead to be reported failing. Default: 3 × the
	// elector's RetryInterval.
	FailingFor time.Duration

	// RequireLeader also reports a candidate that does not lead: a
	// readiness check for services where only the leader serves.
	RequireLeader bool

	// Now is the clock. Default: time.Now.
	Now func() time.Time
}

// Errors wrapped by [Checker.Check], one per reason.
var (
	ErrNoElector    = errors.New("health: no elector")
	ErrOverdue      = errors.New("health: leading past the trust deadline")
	ErrNotRunning   = errors.New("health: election not running")
	ErrFailing      = errors.New("health: campaign failing")
	ErrNotLeader    = errors.New("health: not the leader")
	errInvalidCheck = errors.New("health: invalid Checker")
)

// Check returns nil when the elector is healthy, else an error wrapping
// one of ErrNoElector, ErrOverdue, ErrNotRunning, ErrFailing or
// ErrNotLeader that says why. It is cheap: no round trip. ctx is not used
// today; it is there for checks that will need one.
func (c *Checker) Check(ctx context.Context) error {
	if c == nil || c.Elector == nil {
		return ErrNoElector
	}
	if c.Tolerance < 0 || c.FailingFor < 0 {
		return fmt.Errorf("%w: Tolerance and FailingFor must not be negative", errInvalidCheck)
	}
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	st := c.Elector.State()
	t := now()
	switch {
	case st.Leading && t.After(st.TrustedUntil.Add(c.Tolerance)):
		return fmt.Errorf("%w: term %d was trusted until %v ago and has not stepped down",
			ErrOverdue, st.Term, t.Sub(st.TrustedUntil).Round(time.Millisecond))
	case !st.Running:
		if st.LastError != nil {
			return fmt.Errorf("%w (last error %v ago: %v)", ErrNotRunning, t.Sub(st.LastErrorAt).Round(time.Millisecond), st.LastError)
		}
		return ErrNotRunning
	case !st.Leading && st.LastError != nil && t.Sub(st.LastErrorAt) < c.failingFor():
		return fmt.Errorf("%w: %v ago: %v", ErrFailing, t.Sub(st.LastErrorAt).Round(time.Millisecond), st.LastError)
	case c.RequireLeader && !st.Leading:
		return ErrNotLeader
	}
	return nil
}

func (c *Checker) failingFor() time.Duration {
	if c.FailingFor > 0 {
		return c.FailingFor
	}
	return 3 * c.Elector.Config().RetryInterval
}

// ServeHTTP answers 200 "ok" when [Checker.Check] passes, else 503 with the
// reason on one line (text/plain). With the query parameter verbose, a 200
// also says whether this candidate leads and in which term.
func (c *Checker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := c.Check(r.Context()); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, err)
		return
	}
	if _, ok := r.URL.Query()["verbose"]; ok {
		if st := c.Elector.State(); st.Leading {
			fmt.Fprintf(w, "ok: leading, term %d\n", st.Term)
			return
		}
		fmt.Fprintln(w, "ok: following")
		return
	}
	fmt.Fprintln(w, "ok")
}

// Handler returns a liveness handler for e with the defaults: the same as
// &Checker{Elector: e}.
func Handler(e *leader.Elector) http.Handler { return &Checker{Elector: e} }

// Ready returns a readiness handler for e that passes only while e leads:
// &Checker{Elector: e, RequireLeader: true}.
func Ready(e *leader.Elector) http.Handler { return &Checker{Elector: e, RequireLeader: true} }
