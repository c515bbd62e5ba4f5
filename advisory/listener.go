package advisory

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pglocks/pglocks/internal/backoff"
	"github.com/pglocks/pglocks/internal/dial"
)

// listen keeps one connection LISTENing on the locker's channel until
// Close, reconnecting under the Locker's dial pacing, and with backoff when
// a connection fails after the dial (LISTEN refused, connection lost).
// Notifications carry unlock events ("u"), which wake this process's waiters for the key, and wait events ("w") from
// waiters elsewhere, which make this process's next unlock of the key
// notify. While the listener is down, waiters fall back to backoff polling.
func (l *Locker) listen() {
	defer l.wg.Done()
	var bo backoff.Backoff
	for l.ctx.Err() == nil {
		conn, err := l.dialListener()
		if err != nil {
			continue // dialListener waits for the Locker's dial pacing
		}
		if l.listenOn(conn) {
			bo.Reset() // it listened: the next failure starts afresh
		}
		if l.ctx.Err() != nil || bo.Wait(l.ctx) != nil {
			return
		}
	}
}

// dialListener waits for its turn under the Locker's dial pacing (see
// dialState), then connects; dials of the listener and of sessions share
// one pace.
func (l *Locker) dialListener() (*pgconn.PgConn, error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, ErrClosed
		}
		if l.dial.failed == nil || l.dialing == 0 && !time.Now().Before(l.dial.next) {
			break
		}
		changed, idle, next := l.changed, l.dialing == 0, l.dial.next
		l.mu.Unlock()
		if err := l.awaitChange(l.ctx, changed, idle, next); err != nil {
			return nil, err
		}
	}
	l.dial.listener = true
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.QueryTimeout+l.connectTimeout())
	start := time.Now()
	conn, _, err := l.connect(ctx, l.onNotify, l.cfg.TCPUserTimeout)
	cancel()
	l.mu.Lock()
	l.dial.listener = false
	l.dialEndedLocked(err, start)
	l.mu.Unlock()
	return conn, err
}

// listenOn LISTENs on conn until it fails or the Locker closes, then
// closes it; true if the LISTEN itself worked. It sends a round trip every
// TCPUserTimeout/2 whatever notifications arrive (they are no activity to
// the server), so that the server's idle_session_timeout (TCPUserTimeout,
// see [Locker.connect]) ends the connection once this client is gone — cut
// off behind a session-mode pooler, say, which would keep it for hours
// (TestPartitionedListenerEnds) — and never while it is here; a round trip
// that fails in QueryTimeout ends the connection here too.
func (l *Locker) listenOn(conn *pgconn.PgConn) bool {
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.QueryTimeout)
		_ = conn.Close(ctx)
		cancel()
	}()
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.QueryTimeout)
	_, err := conn.Exec(ctx, "listen "+pgx.Identifier{l.cfg.Channel}.Sanitize()).ReadAll()
	cancel()
	if err != nil {
		return false
	}
	// Unlocks may have gone unheard while the listener was down.
	l.wakeAll()
	hb := dial.NewHeartbeat(l.cfg.TCPUserTimeout)
	for {
		ctx, cancel := context.WithDeadline(l.ctx, hb.Deadline())
		err := conn.WaitForNotification(ctx)
		waited := ctx.Err() != nil
		cancel()
		if l.ctx.Err() != nil || conn.IsClosed() || err != nil && !waited {
			return true
		}
		if hb.Beat(l.ctx, conn, l.cfg.QueryTimeout) != nil {
			return true
		}
	}
}

// onNotify handles one notification; it runs on the listener goroutine.
func (l *Locker) onNotify(_ *pgconn.PgConn, n *pgconn.Notification) {
	ev, id, ok := parsePayload(n.Payload)
	if !ok {
		return
	}
	l.mu.Lock()
	own := l.ownPIDs[n.PID]
	l.mu.Unlock()
	if own {
		return // this process's own sessions: handled locally
	}
	switch ev {
	case 'u':
		l.wake(id)
	case 'w':
		l.markContended(id)
	}
}
