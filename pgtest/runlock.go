package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglocks/pglocks/internal/pooler"
)

// runLock is the session that holds a run's lock (ModeDSN, see sweep.go),
// and its watchdog.
type runLock struct {
	ctx    context.Context // cancelled by Close: ends a check or a wait
	cancel context.CancelFunc
	done   chan struct{} // closed when the watchdog has closed the session
	checks atomic.Int64  // checks done, for the tests
	mu     sync.Mutex
	lost   error // the lock was lost, or not taken back at once: Close returns it
}

// runLockCheck is how often the watchdog checks the lock; a var for the
// tests. runLockSlow is how long a check may take before it is logged as
// slow: a slow check is not a lost session, the session keeps the lock.
var (
	runLockCheck = 5 * time.Second
	runLockSlow  = 30 * time.Second
)

// heldSQL reports whether the run's lock ($1, $2) is granted to this
// session ($3 false) or, behind a pooler ($3 true), to any backend: there
// the statement runs on whatever server session the pooler lends.
const heldSQL = `select exists(select from pg_catalog.pg_locks where locktype = 'advisory'
	and classid = ($1::int8 & 4294967295)::oid and objid = ($2::int8 & 4294967295)::oid
	and objsubid = 2 and granted and ($3::bool or pid = pg_catalog.pg_backend_pid()))`

// othersSQL lists the backends other than this one and $3 that hold the
// run's lock ($1, $2), in any database.
const othersSQL = `select coalesce(array_agg(pid), '{}') from pg_catalog.pg_locks where locktype = 'advisory'
	and classid = ($1::int8 & 4294967295)::oid and objid = ($2::int8 & 4294967295)::oid
	and objsubid = 2 and granted and pid <> pg_catalog.pg_backend_pid() and pid <> $3::int4`

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
			lctx, cancel := context.WithCancel(context.Background())
			s.runLock = &runLock{ctx: lctx, cancel: cancel, done: make(chan struct{})}
			go s.watchRunLock(s.runLock, conn)
			return nil
		}
		s.runID = randomHex(4)
	}
	_ = conn.Close(context.WithoutCancel(ctx))
	return errors.New("run lock: three run ids in a row were taken")
}

// watchRunLock checks every runLockCheck that the run's lock is still
// held (pg_locks, not just a live session: behind a pooler the session
// that took it may be gone while statements still run). A check has no
// deadline: a slow one is logged, not taken for a loss, since closing a
// session that still holds the lock would free it. A session broken
// (the server restarted, the backend was terminated, keepalives failed)
// or a lock gone is logged and the lock taken back; if another backend
// held it meanwhile, another run may have dropped this run's databases,
// and Close returns the error.
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
		case <-l.ctx.Done():
			return
		case <-tick.C:
		}
		if conn != nil {
			held, err := s.checkRunLock(l, conn)
			l.checks.Add(1)
			if l.ctx.Err() != nil {
				return
			}
			if held || (err != nil && !conn.IsClosed()) {
				continue // a statement error on a live session: it still holds the lock
			}
			if err == nil {
				err = errors.New("its session no longer holds it")
			}
			logf("run %s: the run's lock is lost (%v): another run may drop this run's databases until it is taken back", s.runID, err)
		}
		conn = s.retakeRunLock(l, conn)
	}
}

// checkRunLock asks whether conn still holds the run's lock, logging a
// check that takes longer than runLockSlow.
func (s *Server) checkRunLock(l *runLock, conn *pgx.Conn) (bool, error) {
	slow := time.AfterFunc(runLockSlow, func() {
		logf("run %s: the run's lock check has taken over %v: the server is slow; the session keeps the lock", s.runID, runLockSlow)
	})
	defer slow.Stop()
	var held bool
	err := conn.QueryRow(l.ctx, heldSQL, int64(runLockSpace), int64(runKey(s.runID)), s.pooled).Scan(&held)
	return held, err
}

// retakeRunLock takes the run's lock back and returns the session that
// holds it, or nil to try again at the next check. Directly, it opens a
// new session first and waits there for the lock, queued behind the old
// session if that one still holds it (it is granted in the same step that
// frees it), and only then closes the old one. Behind a pooler it claims
// the lock as at start, on the old session if it is still usable.
func (s *Server) retakeRunLock(l *runLock, old *pgx.Conn) *pgx.Conn {
	ctx, cancel := context.WithTimeout(l.ctx, 30*time.Second)
	defer cancel()
	if s.pooled && old != nil && !old.IsClosed() {
		if ok, err := claim(ctx, old, runLockSpace, runKey(s.runID)); err != nil || !ok {
			s.lostRunLock(l, err)
			return old
		}
		logf("run %s: the run's lock is taken back", s.runID)
		return old
	}
	conn, err := lockSession(ctx, s.adminDSN)
	if err != nil {
		s.lostRunLock(l, err)
		if old != nil {
			_ = old.Close(ctx)
		}
		return nil
	}
	var oldPID uint32
	if old != nil && !s.pooled {
		oldPID = old.PgConn().PID()
	}
	if err := s.waitRunLock(l, conn, oldPID); err != nil {
		_ = conn.Close(context.Background())
		s.lostRunLock(l, err)
		return old
	}
	if old != nil {
		_ = old.Close(context.Background())
	}
	logf("run %s: the run's lock is taken back", s.runID)
	return conn
}

// waitRunLock takes the run's lock on conn. Directly, it notes who else
// holds it (the old session, oldPID, is not another), records a loss if
// anyone does, waits for the lock, and looks again. Behind a pooler it
// claims it once.
func (s *Server) waitRunLock(l *runLock, conn *pgx.Conn, oldPID uint32) error {
	key := runKey(s.runID)
	if s.pooled {
		ctx, cancel := context.WithTimeout(l.ctx, 30*time.Second)
		defer cancel()
		ok, err := claim(ctx, conn, runLockSpace, key)
		if err == nil && !ok {
			err = errors.New("another session holds it")
		}
		return err
	}
	others := func() error {
		ctx, cancel := context.WithTimeout(l.ctx, 30*time.Second)
		defer cancel()
		var pids []int32
		if err := conn.QueryRow(ctx, othersSQL, int64(runLockSpace), int64(key), int64(oldPID)).Scan(&pids); err != nil {
			return err
		}
		if len(pids) > 0 {
			s.lostRunLock(l, fmt.Errorf("backends %v held it meanwhile", pids))
		}
		return nil
	}
	if err := others(); err != nil {
		return err
	}
	if _, err := conn.Exec(l.ctx, "select pg_catalog.pg_advisory_lock($1::int4, $2::int4)", runLockSpace, key); err != nil {
		return err
	}
	return others()
}

// lostRunLock logs and records that the run's lock was lost: Close
// returns the first such error.
func (s *Server) lostRunLock(l *runLock, err error) {
	logf("run %s: the run's lock was lost and is not taken back yet: %v", s.runID, err)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost == nil {
		l.lost = fmt.Errorf("pgtest: run %s: the run's lock was lost, and another run may have dropped this run's databases: %w", s.runID, err)
	}
}

// releaseRunLock ends the lock session; it returns the error of a lock
// lost meanwhile.
func (s *Server) releaseRunLock() error {
	l := s.runLock
	if l == nil {
		return nil
	}
	s.runLock = nil
	l.cancel()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}
