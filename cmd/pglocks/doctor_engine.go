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
// version string says.
type engineFindings struct {
	tried  bool
	note   string // why it was not tried, or the probe's error
	report engine.Report
}

// probeEngine runs the engine probe on conn; behind a transaction-mode
// pooler it leaves session locks out (its lock would be stranded there).
func (f *findings) probeEngine(ctx context.Context, cfg *pgxpool.Config, conn dial.Conn) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second) // behind a full pooler the second connection waits
	defer cancel()
	r, err := engine.Probe(ctx, cfg, conn, f.mode.KeepsSession())
	if err != nil {
		f.engine.note = "not decided: " + oneLine(err.Error())
		return
	}
	f.engine.tried, f.engine.report = true, r
}

// engineRows prints one row per primitive and the verdict.
func (f *findings) engineRows(row func(k, v string)) {
	e := f.engine
	check := func(fail *engine.Failure) string {
		switch {
		case !e.tried:
			return e.note
		case fail != nil:
			return "NO: " + fail.What
		}
		return "yes"
	}
	session := check(e.report.SessionLocks)
	if e.report.SessionSkipped {
		session = "not tried: " + f.mode.String() + " strands session locks"
	}
	row("session advisory locks exclude", session)
	row("transaction advisory locks exclude", check(e.report.XactLocks))
	row("clock_timestamp() advances", check(e.report.Clock))
	verdict := "behaves as PostgreSQL (advisory locks exclude, clock advances)"
	if e.report.SessionSkipped {
		verdict = "behaves as PostgreSQL as far as tried (transaction locks exclude, clock advances)"
	}
	switch {
	case !e.tried:
		verdict = "undecided (" + e.note + ")"
	case len(e.report.Failures()) > 0:
		verdict = "NOT COMPATIBLE: pglocks refuses what fails below"
	}
	row("compatibility", verdict)
}

// engineSafety adds the features that the engine's failures make unsafe.
func (f *findings) engineSafety(add func(feature, reason string)) {
	r := f.engine.report
	if r.SessionLocks != nil {
		add("session-locks", r.SessionLocks.Error()+" (advisory.ErrLocksDoNotExclude)")
		add("leader", "session locks do not exclude")
	}
	if r.XactLocks != nil {
		add("xact-locks", r.XactLocks.Error())
	}
	if r.Clock != nil {
		add("leases", r.Clock.Error()+": a lease would never expire")
		add("leader", "the server clock does not advance")
	}
}
