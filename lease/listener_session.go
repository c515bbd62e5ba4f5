package lease

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/dial"
	"github.com/pglocks/pglocks/internal/pooler"
)

// interestLockTimeout bounds the wait for an interest lock: a release holds
// the key for microseconds; a longer wait (a foreign lock on the same key,
// a stalled server) is retried after interestRetry, the waiters meanwhile
// relying on the holder's expiry.
const (
	interestLockTimeout = "200ms"
	interestRetry       = 50 * time.Millisecond
)

// errMovesSessions refuses the listener's connection behind a pooler that
// moves sessions (see [listener.transactionPooled]).
var errMovesSessions = errors.New("lease: the pooler moves sessions")

// session connects, listens, and then alternates between taking or
// dropping interest locks as waiters come and go and waiting for
// notifications, until an error. It reports whether it got as far as
// listening.
//
// The session's idle_session_timeout is dial.ListenIdleTimeout, and it
// sends a round trip every half of it whatever arrives (see
// dial.Heartbeat): a listener cut off from the network behind a
// session-mode pooler, which keeps a dead client's server session for
// hours, is ended by the server, its interest locks with it
// (TestPartitionedListenerEnds).
func (lis *listener) session(ctx context.Context) (listened bool) {
	// Opened as the pool opens its connections (its hooks too); the pooler
	// probe runs before any setting is sent. Kicks interrupt
	// WaitForNotification by a read deadline, which leaves the connection
	// usable (a cancel request would cost a connection).
	poolCfg := lis.s.pool.Config()
	dc, err := dial.Dedicated(ctx, poolCfg, dial.Options{
		DeadlineInterrupt: true,
		Check: func(ctx context.Context, dc dial.Conn) error {
			if pooler.Behind(dc) && lis.transactionPooled(ctx, poolCfg, dc) {
				return errMovesSessions
			}
			return nil
		},
		IdleSessionTimeout: dial.ListenIdleTimeout,
	})
	if err != nil {
		return false
	}
	conn := dc.Conn
	defer func() {
		lis.mu.Lock()
		lis.on = false
		clear(lis.held) // the session's locks die with it
		clear(lis.idle)
		lis.mu.Unlock()
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	setup := "set lock_timeout = '" + interestLockTimeout + "'; listen " + pgx.Identifier{lis.s.q.channel}.Sanitize()
	if err := listenExec(ctx, conn, setup); err != nil {
		return false
	}
	lis.mu.Lock()
	lis.dirty, lis.on = true, true
	lis.mu.Unlock()
	var next time.Duration // until the next reconcile is due; 0: none
	hb := dial.NewHeartbeat(dial.ListenIdleTimeout)
	for {
		lis.mu.Lock()
		if lis.dirty {
			lis.dirty = false
			lis.mu.Unlock()
			if next, err = lis.reconcile(ctx, conn); err != nil {
				return true
			}
			continue
		}
		until := hb.Deadline()
		if at := time.Now().Add(next); next > 0 && at.Before(until) {
			until = at
		}
		wctx, kick := context.WithDeadline(ctx, until)
		lis.kick = kick
		lis.mu.Unlock()

		n, err := conn.WaitForNotification(wctx)

		lis.mu.Lock()
		lis.kick = nil
		if wctx.Err() != nil {
			lis.dirty = true // kicked, or a reconcile is due
		}
		lis.mu.Unlock()
		kick()
		switch {
		case n != nil:
			lis.notified(n.Payload)
		case ctx.Err() != nil || conn.IsClosed():
			return true
		case wctx.Err() == nil && err != nil:
			return true // the connection failed
		}
		if hb.Beat(ctx, conn.PgConn(), listenStatementBound) != nil {
			return true
		}
		// A notification that arrives while reconciling is kept by pgx for
		// the next wait.
	}
}

// reconcile takes the interest lock of every name with waiters that has
// none, and drops those of names without waiters for interestLinger. Every
// waiter of a name whose interest it newly takes is settled and woken: a
// release before that moment did not notify. It returns when it wants to
// run again, and an error only when the connection is unusable.
func (lis *listener) reconcile(ctx context.Context, conn *pgx.Conn) (time.Duration, error) {
	now := time.Now()
	var lock, unlock []string
	var next time.Duration
	lis.mu.Lock()
	for name := range lis.waiters {
		if !lis.held[name] {
			lock = append(lock, name)
		}
	}
	for name, since := range lis.idle {
		if left := interestLinger - now.Sub(since); left > 0 {
			next = minPositive(next, left)
		} else {
			unlock = append(unlock, name)
		}
	}
	lis.mu.Unlock()
	for _, name := range unlock {
		if err := listenExec(ctx, conn, "select pg_catalog.pg_advisory_unlock_shared($1::int8)", interestKey(lis.s.q.channel, name)); err != nil {
			return 0, err
		}
		lis.mu.Lock()
		delete(lis.held, name)
		delete(lis.idle, name)
		if len(lis.waiters[name]) > 0 { // a waiter came back meanwhile
			lis.dirty = true
		}
		lis.mu.Unlock()
	}
	for _, name := range lock {
		err := listenExec(ctx, conn, "select pg_catalog.pg_advisory_lock_shared($1::int8)", interestKey(lis.s.q.channel, name))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			next = minPositive(next, interestRetry)
			continue
		}
		if err != nil {
			return 0, err
		}
		lis.mu.Lock()
		lis.held[name] = true
		if len(lis.waiters[name]) == 0 {
			lis.idle[name] = now
			next = minPositive(next, interestLinger)
		}
		for w := range lis.waiters[name] {
			w.settle()
			poke(w.wake)
		}
		lis.mu.Unlock()
	}
	return next, nil
}

// listenStatementBound bounds each statement of the listening
// connection, its heartbeat's round trip included: on a connection gone silent (a
// partitioned node) a statement would otherwise wait for the kernel to
// give up (some 15 minutes), and the store would hear nothing meanwhile.
// A statement cut short ends the session; the listener opens another.
const listenStatementBound = dial.ListenIdleTimeout / 2

// listenExec runs one statement of the listening connection, bounded by
// listenStatementBound.
func listenExec(ctx context.Context, conn *pgx.Conn, sql string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, listenStatementBound)
	defer cancel()
	_, err := conn.Exec(ctx, sql, args...)
	return err
}

func minPositive(a, b time.Duration) time.Duration {
	if a <= 0 || b < a {
		return b
	}
	return a
}

// transactionPooled probes a connection that is behind a pooler and
// reports whether the pooler moves sessions (transaction or statement
// mode); then the store polls, and says so at Warn
// (see [listener.startPolling]): a LISTEN there would be registered on
// whichever server session ran it, its interest locks stranded there, and
// its lock_timeout left to the next client. A failed probe counts as
// transaction pooling for this attempt only.
func (lis *listener) transactionPooled(ctx context.Context, poolCfg *pgxpool.Config, dc dial.Conn) bool {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	mode, err := pooler.Probe(pctx, poolCfg, dc)
	if err != nil {
		return true
	}
	if !mode.KeepsSession() {
		lis.s.cfg.Logger.Warn("lease: the pool is behind a pooler that moves sessions ("+mode.String()+"), where LISTEN does not work: waiting Acquires poll",
			"every", pollInterval)
		lis.startPolling()
		return true
	}
	return false
}
