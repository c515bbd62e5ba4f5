package main

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/dial"
	"github.com/pglocks/pglocks/internal/engine"
)

// engineFindings is what the engine probe (internal/engine) found: whether
// the server's advisory locks exclude and its clock advances, whatever its
// version string says. A check that could not decide records its error;
// the others still run.
type engineFindings struct {
	report engine.Report
}

// probeEngine runs the engine probe on conn; behind a transaction-mode
// pooler it leaves session locks out (its lock would be stranded there).
func (f *findings) probeEngine(ctx context.Context, cfg *pgxpool.Config, conn dial.Conn) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second) // behind a full pooler the second connection waits
	defer cancel()
	f.engine.report = engine.Probe(ctx, cfg, conn, f.mode.KeepsSession())
}

// engineRows prints one row per primitive and the verdict.
func (f *findings) engineRows(row func(k, v string)) {
	r := f.engine.report
	check := func(c engine.Finding) string {
		switch {
		case c.Err != nil:
			return "not decided: " + oneLine(c.Err.Error())
		case c.Failure != nil:
			return "NO: " + c.Failure.What
		}
		return "yes"
	}
	session := check(r.SessionLocks)
	if r.SessionSkipped {
		session = "not tried: " + f.mode.String() + " strands session locks"
	}
	row("session advisory locks exclude", session)
	row("transaction advisory locks exclude", check(r.XactLocks))
	row("clock_timestamp() advances", check(r.Clock))
	verdict := "behaves as PostgreSQL (advisory locks exclude, clock advances)"
	if r.SessionSkipped {
		verdict = "behaves as PostgreSQL as far as tried (transaction locks exclude, clock advances)"
	}
	switch {
	case len(r.Failures()) > 0:
		verdict = "NOT COMPATIBLE: pglocks refuses what fails below"
	case !r.SessionLocks.Decided() || !r.XactLocks.Decided() || !r.Clock.Decided():
		verdict = "undecided: a check could not run (see above); what it checks is not called safe"
	}
	row("compatibility", verdict)
}

// engineSafety adds the features that the engine's failures make unsafe,
// and those whose check could not decide: undecided is not safe.
func (f *findings) engineSafety(add func(feature, reason string)) {
	r := f.engine.report
	why := func(c engine.Finding) string {
		if c.Failure != nil {
			return c.Failure.Error()
		}
		return "not decided: " + oneLine(c.Err.Error())
	}
	if s := r.SessionLocks; !r.SessionSkipped && (s.Failure != nil || s.Err != nil) {
		add("session-locks", why(s)+" (advisory.ErrLocksDoNotExclude)")
		add("leader", "session locks: "+why(s))
	}
	if x := r.XactLocks; x.Failure != nil || x.Err != nil {
		add("xact-locks", why(x))
	}
	if c := r.Clock; c.Failure != nil || c.Err != nil {
		add("leases", why(c)+": a lease might never expire")
		add("leader", "the server clock: "+why(c))
	}
}
