package pgtest

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
)

// What a run leaves on a server it does not own (ModeDSN, or a local one
// shared by the test binaries of a go test: see share.go), and who
// removes it:
//
//   - Every database a run makes is named pgtest_<run>_<suffix>, <run> being
//     8 hex digits drawn at random when its Server starts, <suffix> 12 hex
//     digits or "template". A [WithMigrator] template is made under such a
//     name too, and renamed to its final one once complete.
//   - Before it makes any, the run takes a session advisory lock on its run
//     id (runLockSpace, the id) on a session it keeps until [Server.Close],
//     with keepalives and none of the server's idle timeouts. A watchdog
//     checks in pg_locks that the lock is still granted to that session;
//     a slow check is waited for, not taken for a loss. Should the
//     session break or the lock be gone, it logs it and takes the lock
//     again on a new session, queued behind the old one if that still
//     holds it; Close returns an error if another backend held the lock
//     meanwhile or it could not be taken back.
//   - A run is alive while any backend, in any database of the server,
//     holds its lock: pg_locks says so server-wide, whatever maintenance
//     database each run connects to. A run starting sweeps: for each other
//     run id found in database names that no backend holds, it takes that
//     lock itself (so that no one claims the id meanwhile) and drops that
//     run's databases that no one is connected to, without FORCE. One with
//     a session (a failed test's kept database being looked at) is left for
//     a later run; so is one the role may not drop. Sweep errors are logged,
//     never fatal.
//   - Behind a pooler (the announced backend pid is not the one that runs
//     statements: PgBouncer, RDS Proxy, Supavisor), a session lock may sit
//     on a server session lent to other clients: such a run holds its lock
//     as well as it can but never sweeps. The sweep needs a direct DSN: a
//     pooler in session mode would do, but the cheap check cannot tell it
//     from one in transaction mode, so it does not sweep either.
//   - A Migrator's template (pgtest_tpl_<digest>) belongs to no run: later
//     runs reuse it. It exists under that name only once complete.
//
// So a live run's databases are never dropped while its lock is held.
// A run whose lock session ends while it goes on (the server restarted,
// the backend terminated, a pooler closed the server session), until its
// watchdog takes the lock back (up to one check period, 5 s, and a
// reconnect), is taken for dead: a run starting then may drop those of
// its databases that have no session at that moment. A database a test
// is using has one; an idle one does not: one made by [Server.CreateDatabase]
// whose test holds no connection to it just then, or one kept for a failed
// test. Close reports the loss only if, taking the lock back, the
// watchdog saw another backend hold it or could not get it: a sweep over
// and done by then goes unreported.

// runDB matches exactly the databases a run makes and captures the run id.
var runDB = regexp.MustCompile(`^pgtest_([0-9a-f]{8})_([0-9a-f]{12}|template)$`)

// dbName names a database of this run: pgtest_<run>_<suffix> on a server
// that outlives the run, pgtest_<suffix> on a private throwaway one.
func (s *Server) dbName(suffix string) string {
	if !s.outlives() {
		return "pgtest_" + suffix
	}
	return "pgtest_" + s.runID + "_" + suffix
}

// sweep drops the idle databases of dead runs, logging what it could not.
func (s *Server) sweep(ctx context.Context, conn *pgx.Conn) {
	if s.pooled {
		logf("not sweeping dead runs' databases: PGTEST_DSN goes through a pooler (give it a direct DSN to sweep)")
		return
	}
	rows, err := conn.Query(ctx, `select datname from pg_catalog.pg_database
		where datname like 'pgtest\_%' and (pg_catalog.pg_has_role(datdba, 'USAGE')
			or (select rolsuper from pg_catalog.pg_roles where rolname = current_user))`)
	if err != nil {
		logf("sweep: %v", err)
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		logf("sweep: %v", err)
		return
	}
	byRun := map[string][]string{}
	for _, name := range names {
		if m := runDB.FindStringSubmatch(name); m != nil && m[1] != s.runID {
			byRun[m[1]] = append(byRun[m[1]], name)
		}
	}
	for run, names := range byRun {
		if err := s.dropIfDead(ctx, conn, run, names); err != nil {
			logf("sweep: %v", err)
		}
	}
}

// dropIfDead drops names, the databases of run, if no backend holds run's
// lock, holding it meanwhile. It leaves those that have a session.
func (s *Server) dropIfDead(ctx context.Context, conn *pgx.Conn, run string, names []string) error {
	key := runKey(run)
	dead, err := claim(ctx, conn, runLockSpace, key)
	if err != nil || !dead {
		return err
	}
	defer conn.Exec(context.WithoutCancel(ctx), "select pg_catalog.pg_advisory_unlock($1::int4, $2::int4)", runLockSpace, key) //nolint:errcheck
	var errs []error
	for _, name := range names {
		var busy bool
		if err := conn.QueryRow(ctx, "select exists(select from pg_catalog.pg_stat_activity where datname = $1)", name).Scan(&busy); err != nil {
			return errors.Join(append(errs, err)...)
		}
		if busy {
			continue // a later run drops it once no one is connected
		}
		if _, err := conn.Exec(ctx, "drop database if exists "+pgx.Identifier{name}.Sanitize()); err != nil {
			errs = append(errs, fmt.Errorf("drop database %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// dropRun drops this run's databases at Close (outlives), but for those
// kept for a failed test: a later run's sweep drops them.
func (s *Server) dropRun(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.adminDSN)
	if err != nil {
		return fmt.Errorf("pgtest: close: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, "select datname from pg_database where datname like $1", "pgtest\\_"+s.runID+"\\_%")
	if err != nil {
		return fmt.Errorf("pgtest: close: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("pgtest: close: %w", err)
	}
	var errs []error
	for _, name := range names {
		if m := runDB.FindStringSubmatch(name); m == nil || m[1] != s.runID {
			continue // named like a run's database, but not one a run makes
		}
		s.mu.Lock()
		_, keep := s.kept[name]
		s.mu.Unlock()
		if !keep {
			errs = append(errs, s.dropWith(ctx, conn, name))
		}
	}
	return errors.Join(errs...)
}
