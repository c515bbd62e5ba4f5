package advisory

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// listenCheckInterval is how often an idle listener pings its connection.
const listenCheckInterval = 5 * time.Second

// listen keeps one connection LISTENing on the locker's channel until Close,
// reconnecting with backoff. Notifications carry unlock events ("u"), which
// wake this process's waiters for the key, and wait events ("w") from
// waiters elsewhere, which make this process's next unlock of the key
// notify. While the listener is down, waiters fall back to backoff polling.
func (l *Locker) listen() {
	defer l.wg.Done()
	backoff := l.cfg.MinBackoff
	for l.ctx.Err() == nil {
		err := l.listenOnce()
		if l.ctx.Err() != nil {
			return
		}
		if err == nil {
			backoff = l.cfg.MinBackoff
		}
		t := time.NewTimer(jitter(backoff))
		select {
		case <-t.C:
		case <-l.ctx.Done():
		}
		t.Stop()
		backoff = min(2*backoff, time.Second)
	}
}

func (l *Locker) listenOnce() error {
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.QueryTimeout+l.connectTimeout())
	conn, err := l.connect(ctx, l.onNotify)
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.QueryTimeout)
		_ = conn.Close(ctx)
		cancel()
	}()
	ctx, cancel = context.WithTimeout(l.ctx, l.cfg.QueryTimeout)
	_, err = conn.Exec(ctx, "listen "+pgx.Identifier{l.cfg.Channel}.Sanitize()).ReadAll()
	cancel()
	if err != nil {
		return err
	}
	// Unlocks may have gone unheard while the listener was down.
	l.wakeAll()
	for {
		ctx, cancel := context.WithTimeout(l.ctx, listenCheckInterval)
		err := conn.WaitForNotification(ctx)
		cancel()
		if l.ctx.Err() != nil {
			return nil
		}
		if err == nil {
			continue
		}
		if conn.IsClosed() {
			return err
		}
		ctx, cancel = context.WithTimeout(l.ctx, l.cfg.QueryTimeout)
		err = conn.Ping(ctx)
		cancel()
		if err != nil {
			return err
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
