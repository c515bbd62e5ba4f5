package dial

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ListenIdleTimeout is the idle_session_timeout of the dedicated
// connections that wait for notifications and have no setting of their
// own for it (the lease store's listener, the leader's Observe); they send
// a round trip every half of it (see [Heartbeat]).
const ListenIdleTimeout = 10 * time.Second

// IdleSessionTimeout returns the statement that sets idle_session_timeout
// to d (in milliseconds; 0: none) on servers that have it, PostgreSQL 14
// and later, and "" on older ones.
func IdleSessionTimeout(pc *pgconn.PgConn, d time.Duration) string {
	v := pc.ParameterStatus("server_version")
	if i := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		v = v[:i]
	}
	if major, err := strconv.Atoi(v); err == nil && major >= 14 {
		return fmt.Sprintf("set idle_session_timeout = %d", d.Milliseconds())
	}
	return ""
}

// Heartbeat paces the round trips of a dedicated connection that mostly
// waits — for notifications, say — and whose idle_session_timeout is set
// (see Options.IdleSessionTimeout): one at least every half of it,
// whatever arrives meanwhile (a notification is no activity to the
// server), so that the server ends the session only once the client has
// stopped, for instance when it is cut off from a session-mode pooler
// whose own link to the server stays healthy, or from the server itself.
// A Heartbeat is used by one goroutine.
type Heartbeat struct {
	every time.Duration
	next  time.Time
}

// NewHeartbeat returns the Heartbeat of a connection whose
// idle_session_timeout is idle, just used.
func NewHeartbeat(idle time.Duration) *Heartbeat {
	h := &Heartbeat{every: idle / 2}
	h.next = time.Now().Add(h.every)
	return h
}

// Deadline is when the next round trip is due: wait no longer than that.
func (h *Heartbeat) Deadline() time.Time { return h.next }

// Beat sends a round trip on pc (an empty query), bounded by timeout, if
// one is due, and returns its error: the connection is then to be given
// up. Notifications that arrive meanwhile go to pc's handler.
func (h *Heartbeat) Beat(ctx context.Context, pc *pgconn.PgConn, timeout time.Duration) error {
	now := time.Now()
	if now.Before(h.next) {
		return nil
	}
	h.next = now.Add(h.every)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := pc.Ping(ctx); err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	return nil
}
