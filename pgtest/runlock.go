package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglocks/pglocks/internal/pooler"
)

// runLock is the session that holds a run's lock (ModeDSN, see sweep.go),
// and its watchdog.
type runLock struct {
	stop chan struct{} // closed by Close
	done chan struct{} // closed when the watchdog has closed the session
	mu   sync.Mutex
	lost error // the lock could not be taken back: Close returns it
}

// runLockCheck is how often the watchdog checks the lock session.
const runLockCheck = 5 * time.Second

// claimSQL takes the advisory lock ($1, $2) in its two-key form if no other
// backend, in any database of the server, holds it, and reports whether it
// did: pg_locks shows every database's locks, where a try-lock sees only
// those of its own. One statement, so that it runs on one server session
// even behind a pooler.
const claimSQL = `select case when pg_catalog.pg_try_advisory_lock($1::int8::int4, $2::int8::int4) then
	case when exists(select from pg_catalog.pg_locks where locktype = 'advisory'
		and classid = ($1::int8 & 4294967295)::oid and objid = ($2::int8 & 4294967295)::oid
		and objsubid = 2 and granted and pid is distinct from pg_catalog.pg_backend_pid())
	then not pg_catalog.pg_advisory_unlock($1::int8::int4, $2::int8::int4) else true end
	else false end`

func runKey(run string) int32 {
	n, _ := strconv.ParseUint(run, 16, 32)
	return int32(uint32(n))
}

// lockSession connects for a long-held lock: TCP keepalives every 15 s,
// and none of the server's idle timeouts, which would end it while the run
// goes on.
func lockSession(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.DialFunc = (&net.Dialer{KeepAlive: 15 * time.Second}).DialContext
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, `select pg_catalog.set_config(name, '0', false) from pg_catalog.pg_settings
		where name in ('idle_session_timeout', 'idle_in_transaction_session_timeout')`); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

// claim takes the advisory lock (space, key) on conn if no backend of any
// database holds it, and reports whether it did. It takes the lock first
// and looks second, as everyone who claims does: of two claimants at once,
// at least one sees the other and backs off.
func claim(ctx context.Context, conn *pgx.Conn, space, key int32) (bool, error) {
	var got bool
	err := conn.QueryRow(ctx, claimSQL, int64(space), int64(key)).Scan(&got)
	return got, err
}

// holdRunLock opens the session that holds this run's lock, and starts its
// watchdog. A run id already held anywhere on the server is replaced by
// another. Behind a pooler, the run records that it may not sweep.
func (s *Server) holdRunLock(ctx context.Context) error {
	conn, err := lockSession(ctx, s.adminDSN)
	if err != nil {
		return err
	}
	pid, err := pooler.BackendPID(ctx, conn.PgConn())
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return fmt.Errorf("run lock: %w", err)
	}
	s.pooled = pid != conn.PgConn().PID()
	for range 3 {
		ok, err := claim(ctx, conn, runLockSpace, runKey(s.runID))
		if err != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
			return fmt.Errorf("run lock: %w", err)
		}
		if ok {
			s.runLock = &runLock{stop: make(chan struct{}), done: make(chan struct{})}
			go s.watchRunLock(s.runLock, conn)
			return nil
		}
		s.runID = randomHex(4)
	}
	_ = conn.Close(context.WithoutCancel(ctx))
	return errors.New("run lock: three run ids in a row were taken")
}

// watchRunLock checks the lock session every runLockCheck. A session lost
// (the server restarted, the backend was terminated) is logged, and the
// lock taken back on a new session; while it cannot be, another run may
// drop this run's databases, and Close returns the error.
func (s *Server) watchRunLock(l *runLock, conn *pgx.Conn) {
	defer close(l.done)
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	tick := time.NewTicker(runLockCheck)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), runLockCheck)
		if conn != nil {
			if _, err := conn.Exec(ctx, "select"); err == nil {
				cancel()
				continue
			}
			logf("run %s: the session holding the run's lock is lost: another run may drop this run's databases until it is taken back", s.runID)
			_ = conn.Close(ctx)
			conn = nil
		}
		conn = s.retakeRunLock(ctx, l)
		cancel()
	}
}

// retakeRunLock takes the run's lock again on a new session, or records
// and logs why it could not.
func (s *Server) retakeRunLock(ctx context.Context, l *runLock) *pgx.Conn {
	conn, err := lockSession(ctx, s.adminDSN)
	ok := false
	if err == nil {
		if ok, err = claim(ctx, conn, runLockSpace, runKey(s.runID)); err == nil && !ok {
			err = errors.New("another session holds it")
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ok {
		logf("run %s: the run's lock is taken back", s.runID)
		return conn
	}
	if conn != nil {
		_ = conn.Close(ctx)
	}
	logf("run %s: the run's lock was lost and cannot be taken back: %v", s.runID, err)
	l.lost = fmt.Errorf("pgtest: run %s: the run's lock was lost and could not be taken back at once: %w", s.runID, err)
	return nil
}

// releaseRunLock ends the lock session; it returns the error of a lock
// lost and never taken back.
func (s *Server) releaseRunLock() error {
	l := s.runLock
	if l == nil {
		return nil
	}
	s.runLock = nil
	close(l.stop)
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}
