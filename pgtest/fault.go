package pgtest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// TerminateBackend terminates the server process (backend) pid with
// pg_terminate_backend, as an operator or a failover would, and returns only
// once the backend is gone from pg_stat_activity: the session's next query
// fails and everything it held, session advisory locks included, is free.
// ctx bounds the whole wait. Terminating a pid that does not exist is an
// error.
func (s *Server) TerminateBackend(ctx context.Context, pid uint32) error {
	conn, err := pgx.Connect(ctx, s.adminDSN)
	if err != nil {
		return fmt.Errorf("pgtest: terminate backend %d: %w", pid, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ok bool
	if err := conn.QueryRow(ctx, "select pg_terminate_backend($1)", int32(pid)).Scan(&ok); err != nil {
		return fmt.Errorf("pgtest: terminate backend %d: %w", pid, err)
	}
	if !ok {
		return fmt.Errorf("pgtest: terminate backend %d: no such backend", pid)
	}
	return waitGone(ctx, conn, []int32{int32(pid)})
}

// TerminateApplication terminates every backend, other than the caller's,
// whose application_name is name, and returns how many it terminated once
// all of them are gone (see [Server.TerminateBackend]). On a server that
// other runs use too (PGTEST_DSN, or the local server that the test
// binaries of a go test share), backends connected to another run's
// databases are left alone.
func (s *Server) TerminateApplication(ctx context.Context, name string) (int, error) {
	return s.terminateApplication(ctx, name, "")
}

// TerminateApplication is [Server.TerminateApplication] for the backends
// connected to this database only: on a shared server, tests that run in
// parallel may use the same application_name in databases of their own.
func (d *DB) TerminateApplication(ctx context.Context, name string) (int, error) {
	return d.Server.terminateApplication(ctx, name, d.Name)
}

// terminateApplication terminates the backends of application name, in
// database datname if it is not empty.
func (s *Server) terminateApplication(ctx context.Context, name, datname string) (int, error) {
	conn, err := pgx.Connect(ctx, s.adminDSN)
	if err != nil {
		return 0, fmt.Errorf("pgtest: terminate application %q: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Find first, then terminate: the planner may evaluate a
	// pg_terminate_backend in a WHERE clause before the other conditions.
	others := "" // a pattern of this run's database names, when other runs may be there
	if s.outlives() {
		others = "pgtest\\_" + s.runID + "\\_%"
	}
	rows, err := conn.Query(ctx, `select pid from pg_stat_activity
		where application_name = $1 and pid <> pg_backend_pid() and ($2 = '' or datname = $2)
		and not ($3 <> '' and coalesce(datname, '') ~ '^pgtest_[0-9a-f]{8}_([0-9a-f]{12}|template)$'
			and datname not like $3)`, name, datname, others)
	if err != nil {
		return 0, fmt.Errorf("pgtest: terminate application %q: %w", name, err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return 0, fmt.Errorf("pgtest: terminate application %q: %w", name, err)
	}
	var n int
	if err := conn.QueryRow(ctx, "select count(*) from unnest($1::int4[]) pid where pg_terminate_backend(pid)", pids).Scan(&n); err != nil {
		return 0, fmt.Errorf("pgtest: terminate application %q: %w", name, err)
	}
	return n, waitGone(ctx, conn, pids)
}

// waitGone waits until none of pids is in pg_stat_activity any more. A
// terminated backend leaves within milliseconds; the loop polls briefly.
func waitGone(ctx context.Context, conn *pgx.Conn, pids []int32) error {
	if len(pids) == 0 {
		return nil
	}
	delay := 500 * time.Microsecond
	for {
		var left int
		err := conn.QueryRow(ctx, "select count(*) from pg_stat_activity where pid = any($1)", pids).Scan(&left)
		if err != nil {
			return fmt.Errorf("pgtest: wait for terminated backends %v: %w", pids, err)
		}
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: backends %v still present: %w", pids, context.Cause(ctx))
		case <-time.After(delay):
		}
		delay = min(2*delay, 20*time.Millisecond)
	}
}
