package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// features doctor can be asked about with --need.
var features = []string{"session-locks", "xact-locks", "leases", "listen", "leader", "schedule"}

// cmdDoctor checks a database for pglocks and prints what works there. It
// exits 0 when every feature of --need is safe, 1 otherwise.
func cmdDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, dsn := newFlags(ctx, "doctor", helps["doctor"], stdout, stderr, true)
	need := fs.String("need", "", "comma-separated features that must be safe: "+strings.Join(features, ","))
	var t tables
	t.add(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fail(exitUsage, "usage: pglocks doctor [--need FEATURES] [--schema S] [--table T] [--run-table T]")
	}
	var needs []string
	for n := range strings.SplitSeq(*need, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if !slices.Contains(features, n) {
			return fail(exitUsage, "--need: unknown feature %q (known: %s)", n, strings.Join(features, ", "))
		}
		needs = append(needs, n)
	}
	if err := t.check(); err != nil {
		return err
	}
	// QueryExecModeExec works behind any pooler: doctor must not fail
	// where it is asked to look.
	// The write check uses the DSN's own exec mode, as the user's pool would.
	var userMode pgx.QueryExecMode
	pool, err := connect(ctx, *dsn, func(c *pgxpool.Config) {
		userMode = c.ConnConfig.DefaultQueryExecMode
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	})
	if err != nil {
		return err
	}
	defer pool.Close()
	return doctor(ctx, pool, userMode, t, needs, stdout)
}

func doctor(ctx context.Context, pool *pgxpool.Pool, userMode pgx.QueryExecMode, t tables, needs []string, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	f, err := examine(ctx, pool, userMode, t)
	if err != nil {
		return fail(exitUnavailable, "doctor: %v", err)
	}
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(w, "%s\t%s\n", k, v) }
	role := "primary"
	if f.standby {
		role = "standby (in recovery)"
	}
	row("server", "PostgreSQL "+f.version+", "+role)
	row("pooler", f.mode.String())
	f.engineRows(row)
	sessionNote := ""
	if !f.mode.KeepsSession() {
		sessionNote = "not tried: it would be stranded on a pooled server session"
	}
	row("session lock kept between statements", yesNo(f.sessionOK, sessionNote))
	row("transactions (BEGIN … COMMIT)", yesNo(f.txOK, f.txNote))
	row("autocommitted writes committed", yesNo(f.writeOK, f.writeNote))
	row("NOTIFY arrives", yesNo(f.notifyOK, f.notifyNote))
	switch {
	case !f.tableOK:
		row("lease table", f.table+": missing (run pglocks migrate)")
	case len(f.privs) > 0:
		row("lease table", f.table+": missing privilege "+strings.Join(f.privs, ", "))
	default:
		row("lease table", f.table+": present, SELECT/INSERT/UPDATE granted")
	}
	switch {
	case !f.runTableOK:
		row("run table", f.runTable+": missing (run pglocks migrate)")
	case len(f.runPrivs) > 0:
		row("run table", f.runTable+": missing privilege "+strings.Join(f.runPrivs, ", "))
	default:
		row("run table", f.runTable+": present, SELECT/INSERT/UPDATE/DELETE granted")
	}
	row("advisory lock capacity", fmt.Sprintf("%d (max_locks_per_transaction × (max_connections + max_prepared_transactions))", f.capacity))
	for _, s := range f.settings {
		row(s[0], s[1])
	}
	row("clock offset (server − client)", fmt.Sprintf("%v ± %v", f.offset.Round(time.Microsecond), (f.rtt/2).Round(time.Microsecond)))
	why, notes := f.safe()
	failed := false
	for _, feat := range features {
		verdict := "safe"
		if n := notes[feat]; n != "" {
			verdict += ": " + n
		}
		if r := why[feat]; r != "" {
			verdict = "NOT SAFE: " + r
			if slices.Contains(needs, feat) {
				failed = true
			}
		}
		row("feature "+feat, verdict)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if failed {
		return exitCode(1)
	}
	return nil
}

func yesNo(ok bool, note string) string {
	s := "no"
	if ok {
		s = "yes"
	}
	if note != "" {
		s += " (" + note + ")"
	}
	return s
}
