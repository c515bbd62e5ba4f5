package pgtest

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// What a run leaves on a server it does not own (ModeDSN), and who removes
// it:
//
//   - Every database a run makes is named pgtest_<run>_<suffix>, <run> being
//     8 hex digits drawn at random when its Server starts.
//   - Before it makes any, the run takes a session advisory lock on its run
//     id (runLockSpace, the id) on a connection it keeps until
//     [Server.Close]. The lock is held exactly as long as the run lives, or
//     its connection: a killed process's session ends, and its lock with it.
//   - A run starting sweeps: for each other run id found in database names
//     whose lock it can take (pg_try_advisory_lock), that run is gone, and
//     it drops that run's databases. A run whose lock is held is alive, and
//     nothing of it is touched.
//   - A Migrator's template (pgtest_tpl_<digest>) belongs to no run: later
//     runs reuse it. One without its completion mark is half made; the sweep
//     drops it when its making lock is free (no one is making it).
//
// A run whose lock session ends while it goes on (the server restarted,
// the backend terminated) is taken for dead: a run starting then may drop
// its databases under it.

// runDB matches the databases of a run and captures the run id.
var runDB = regexp.MustCompile(`^pgtest_([0-9a-f]{8})_[a-z0-9]+$`)

// dbName names a database of this run: pgtest_<run>_<suffix> on a server
// that outlives the run, pgtest_<suffix> on a throwaway one.
func (s *Server) dbName(suffix string) string {
	if s.mode != ModeDSN {
		return "pgtest_" + suffix
	}
	return "pgtest_" + s.runID + "_" + suffix
}

func runKey(run string) int32 {
	n, _ := strconv.ParseUint(run, 16, 32)
	return int32(uint32(n))
}

// holdRunLock opens the connection that holds this run's lock. An id whose
// lock is held (a sweep holds a dead run's lock while it drops) is
// replaced by another.
func (s *Server) holdRunLock(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.adminDSN)
	if err != nil {
		return err
	}
	for range 3 {
		var ok bool
		if err := conn.QueryRow(ctx, "select pg_catalog.pg_try_advisory_lock($1::int4, $2::int4)", runLockSpace, runKey(s.runID)).Scan(&ok); err != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
			return fmt.Errorf("run lock: %w", err)
		}
		if ok {
			s.runLock = conn
			return nil
		}
		s.runID = randomHex(4)
	}
	_ = conn.Close(context.WithoutCancel(ctx))
	return errors.New("run lock: three run ids in a row were taken")
}

func (s *Server) releaseRunLock() {
	if s.runLock != nil {
		_ = s.runLock.Close(context.Background())
		s.runLock = nil
	}
}

// sweep drops the databases of dead runs and the half-made templates no
// one is making.
func (s *Server) sweep(ctx context.Context, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, "select datname, shobj_description(oid, 'pg_database') from pg_database where datname like 'pgtest\\_%'")
	if err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	byRun := map[string][]string{}
	var halfMade []string
	for rows.Next() {
		var name string
		var mark *string
		if err := rows.Scan(&name, &mark); err != nil {
			return fmt.Errorf("sweep: %w", err)
		}
		if m := runDB.FindStringSubmatch(name); m != nil && m[1] != s.runID {
			byRun[m[1]] = append(byRun[m[1]], name)
		} else if len(name) == len(templatePrefix)+24 && name[:len(templatePrefix)] == templatePrefix && mark == nil {
			halfMade = append(halfMade, name)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	var errs []error
	for run, names := range byRun {
		errs = append(errs, s.dropIfFree(ctx, conn, runLockSpace, runKey(run), names))
	}
	for _, name := range halfMade {
		errs = append(errs, s.dropIfFree(ctx, conn, tplLockSpace, lockKey(name), []string{name}))
	}
	return errors.Join(errs...)
}

// dropIfFree drops names if the advisory lock (space, key) is free, holding
// it meanwhile so that no one takes it in between.
func (s *Server) dropIfFree(ctx context.Context, conn *pgx.Conn, space, key int32, names []string) error {
	var free bool
	if err := conn.QueryRow(ctx, "select pg_catalog.pg_try_advisory_lock($1::int4, $2::int4)", space, key).Scan(&free); err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	if !free {
		return nil
	}
	defer conn.Exec(context.WithoutCancel(ctx), "select pg_catalog.pg_advisory_unlock($1::int4, $2::int4)", space, key) //nolint:errcheck
	for _, name := range names {
		if err := s.dropWith(ctx, conn, name); err != nil {
			return err
		}
	}
	return nil
}

// dropRun drops this run's databases at Close (ModeDSN), but for those
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
		s.mu.Lock()
		_, keep := s.kept[name]
		s.mu.Unlock()
		if !keep {
			errs = append(errs, s.dropWith(ctx, conn, name))
		}
	}
	return errors.Join(errs...)
}
