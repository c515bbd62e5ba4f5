package advisory

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/internal/dial"
	"github.com/pglocks/pglocks/internal/lockstmt"
	"github.com/pglocks/pglocks/internal/outcome"
	"github.com/pglocks/pglocks/internal/pooler"
)

// connect opens a dedicated connection the way the pool opens its own
// (see [dial.Dedicated]): from a copy of the pool's ConnConfig, through its
// BeforeConnect hook (rotated passwords, IAM tokens) and AfterConnect hook.
// Only application_name goes in the startup packet (every pooler accepts
// it). The backend's real pid is read first (behind a pooler the
// connection's own PID is the pooler's), then the connection is judged
// (see [Locker.accept]) and only then is the rest of the session hygiene
// set, by one statement (see [Locker.sessionSettings]): a connection
// refused behind a transaction-mode pooler leaves no setting on the server
// session the pooler lends to others next (TestRefusedDialLeavesNoSettings).
// The client socket gets keepalives, and a statement is interrupted by a
// socket deadline (pgx's default) rather than by a cancel request on a new
// TCP connection.
//
// idle is the connection's idle_session_timeout (PostgreSQL 14 and later):
// Config.TCPUserTimeout, for the sessions that hold locks and for the
// LISTEN connection alike.
func (l *Locker) connect(ctx context.Context, onNotify pgconn.NotificationHandler, idle time.Duration) (*pgconn.PgConn, uint32, error) {
	c := l.cfg
	conn, err := dial.Dedicated(ctx, l.poolCfg, dial.Options{
		ApplicationName:    c.ApplicationName,
		OnNotification:     onNotify,
		Keepalive:          net.KeepAliveConfig{Enable: true, Idle: c.KeepalivesIdle, Interval: c.KeepalivesInterval, Count: c.KeepalivesCount},
		DeadlineInterrupt:  true,
		Check:              l.accept,
		Settings:           func(*pgconn.PgConn) string { return l.sessionSettings() },
		IdleSessionTimeout: idle,
	})
	if err != nil {
		return nil, 0, err
	}
	return conn.PgConn(), conn.BackendPID, nil
}

// accept refuses a connection that reaches the server through a pooler in
// transaction or statement mode (see [refuseTransactionPooling]), that
// reached a standby ([ErrStandby]), or whose server's advisory locks do not
// exclude ([ErrLocksDoNotExclude], proved once per Locker by
// [Locker.proveEngine]); it runs before any setting is sent.
func (l *Locker) accept(ctx context.Context, conn dial.Conn) error {
	if err := refuseTransactionPooling(ctx, l.poolCfg, conn); err != nil {
		return err
	}
	if conn.InRecovery {
		return outcome.MarkFatal(ErrStandby)
	}
	return l.proveEngine(ctx, conn)
}

// refuseTransactionPooling fails the dial of a connection that reaches the
// server through a pooler in transaction mode, where a session lock would
// be taken on one server session and left there (see [ErrTransactionPooling]).
// A connection whose startup pid is its backend's (no pooler) costs nothing
// more; behind a pooler the probe opens one more connection, once per dial.
func refuseTransactionPooling(ctx context.Context, pool *pgxpool.Config, conn dial.Conn) error {
	if !pooler.Behind(conn) {
		return nil
	}
	mode, err := pooler.Probe(ctx, pool, conn)
	if err != nil {
		return err
	}
	if !mode.KeepsSession() {
		return outcome.MarkFatal(ErrTransactionPooling)
	}
	return nil
}

// sessionSettings is the statement every connection of the Locker runs
// after connecting and being accepted (see [Locker.connect]), before it is
// used; internal/dial appends idle_session_timeout = Config.TCPUserTimeout
// (PostgreSQL 14 and later). They bound how long the server keeps a
// partitioned holder's session (Config's timing rule) in two ways:
// server-side TCP keepalives and tcp_user_timeout, which act on the
// server's own TCP connection — enough when that connection is the
// holder's — and idle_session_timeout, which ends a session the server has
// heard nothing from, no statement and no ping, for that long. Only the
// latter holds behind a session-mode pooler or a TCP proxy, whose healthy
// link to the server outlives a partitioned client (PgBouncer keeps it
// until its own client keepalive gives up: two hours by the OS defaults);
// it needs PostgreSQL 14. A healthy session is never idle that long: the
// session pings one that holds locks every PingInterval (or
// TCPUserTimeout/2 if shorter) and one that holds none every
// TCPUserTimeout/2 (see [session.pingDue]), and the LISTEN connection
// sends a round trip every TCPUserTimeout/2 whatever notifications arrive
// (notifications are no activity to the server; see [Locker.listenOn]).
//
// The other timeouts are set to 0 so that a role's or database's
// statement_timeout, lock_timeout or idle_in_transaction_session_timeout
// cannot cancel a try or unlock or end a session that holds locks;
// synchronous_commit is off because only a NOTIFY assigns a transaction id
// here, and its commit need not wait for the WAL flush. statement_timeout
// comes first, so the rest cannot be cancelled by a tiny role default; the
// first statement itself can be, on a stalled server, and then the dial
// runs the settings again (internal/dial).
//
// The settings are one simple-protocol query, so they take effect all
// together or not at all: if the server (or a pooler) refuses any of them,
// the connection is closed and the dial fails with the server's error. A
// session without the timing settings therefore never holds a lock.
func (l *Locker) sessionSettings() string {
	c := l.cfg
	return fmt.Sprintf("set statement_timeout = 0; set lock_timeout = 0; "+
		"set idle_in_transaction_session_timeout = 0; "+
		"set tcp_keepalives_idle = %d; set tcp_keepalives_interval = %d; set tcp_keepalives_count = %d; "+
		"set tcp_user_timeout = %d; set synchronous_commit = off",
		int(c.KeepalivesIdle/time.Second), int(c.KeepalivesInterval/time.Second), c.KeepalivesCount,
		int(c.TCPUserTimeout/time.Millisecond))
}

type stmtKind uint8

const (
	stmtTry stmtKind = iota
	stmtUnlock
	stmtUnlockNotify
)

// stmt returns the name and SQL of a prepared statement. Key arguments come
// first ($1, or $1, $2 for a pair), then channel and payload.
func stmt(kind stmtKind, space pglocks.Space, shared, want bool) (name, sql string) {
	pair := space == pglocks.SpaceInt32Pair
	_, next := lockstmt.Args(pair)
	notify := fmt.Sprintf("pg_catalog.pg_notify($%d::text, $%d::text)", next, next+1)
	switch kind {
	case stmtTry:
		if want {
			sql = "select l, case when not l then " + notify + " end from " + lockstmt.Call(lockstmt.Try(shared), pair) + " as l"
		} else {
			sql = lockstmt.Select(lockstmt.Try(shared), pair)
		}
	case stmtUnlock:
		sql = lockstmt.Select(lockstmt.Release(shared), pair)
	case stmtUnlockNotify:
		sql = lockstmt.Select(lockstmt.Release(shared), pair) + ", " + notify
	}
	name = fmt.Sprintf("pglocks_%d_%d_%t_%t", kind, space, shared, want)
	return name, sql
}

// stmtTable holds every statement by [kind][space][shared][want].
var stmtTable = func() (t [3][3][2][2]struct{ name, sql string }) {
	for _, kind := range []stmtKind{stmtTry, stmtUnlock, stmtUnlockNotify} {
		for _, space := range []pglocks.Space{pglocks.SpaceInt64, pglocks.SpaceInt32Pair} {
			for _, shared := range []bool{false, true} {
				for _, want := range []bool{false, true} {
					if want && kind != stmtTry {
						continue
					}
					e := &t[kind][space][b2i(shared)][b2i(want)]
					e.name, e.sql = stmt(kind, space, shared, want)
				}
			}
		}
	}
	return t
}()

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// prepareAll prepares every statement on a new session.
func prepareAll(ctx context.Context, conn *pgconn.PgConn) error {
	for _, byKind := range stmtTable {
		for _, bySpace := range byKind {
			for _, byShared := range bySpace {
				for _, e := range byShared {
					if e.name == "" {
						continue
					}
					if _, err := conn.Prepare(ctx, e.name, e.sql, nil); err != nil {
						return fmt.Errorf("prepare %s: %w", e.name, err)
					}
				}
			}
		}
	}
	if _, err := conn.Prepare(ctx, anyName, anySQL, nil); err != nil {
		return fmt.Errorf("prepare %s: %w", anyName, err)
	}
	return nil
}

// stmtArgs returns the prepared statement and parameters for key.
func (s *session) stmtArgs(kind stmtKind, key pglocks.Key, shared, want bool) (string, [][]byte, []int16) {
	want = want && kind == stmtTry
	name := stmtTable[kind][key.Space()][b2i(shared)][b2i(want)].name
	var buf [8]byte
	hi, lo, pair := key.Pair()
	params, formats := putKey(&buf, hi, lo, pair, key.Int64())
	if want || kind == stmtUnlockNotify {
		ev := "u"
		if want {
			ev = "w"
		}
		params = append(params, []byte(s.l.cfg.Channel), []byte(payload(ev, key)))
		formats = append(formats, 0, 0)
	}
	return name, params, formats
}

// payload is the NOTIFY payload for an event on key: "u" (unlocked) or "w"
// (wanted), the key's space and its value: "u:1:42".
func payload(ev string, key pglocks.Key) string {
	return ev + ":" + strconv.Itoa(int(key.Space())) + ":" + strconv.FormatInt(key.Int64(), 10)
}

// parsePayload reverses payload.
func parsePayload(p string) (ev byte, id keyID, ok bool) {
	if len(p) < 5 || p[1] != ':' || p[3] != ':' {
		return 0, keyID{}, false
	}
	sp := pglocks.Space(p[2] - '0')
	if sp != pglocks.SpaceInt64 && sp != pglocks.SpaceInt32Pair {
		return 0, keyID{}, false
	}
	v, err := strconv.ParseInt(p[4:], 10, 64)
	if err != nil {
		return 0, keyID{}, false
	}
	return p[0], keyID{sp, v}, true
}
