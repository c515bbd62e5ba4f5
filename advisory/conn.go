package advisory

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/pglocks/pglocks"
)

// connect opens a dedicated connection from the pool's connection config
// with the session hygiene of cfg: application_name, server-side TCP
// keepalives and user timeout, client-side keepalive, and a context watcher
// that interrupts a statement by a socket deadline (pgx's default) rather
// than by a cancel request on a new TCP connection.
func (l *Locker) connect(ctx context.Context, onNotify pgconn.NotificationHandler) (*pgconn.PgConn, error) {
	cfg := l.connCfg.Copy()
	c := l.cfg
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = c.ApplicationName
	cfg.RuntimeParams["tcp_keepalives_idle"] = strconv.Itoa(int(c.KeepalivesIdle / time.Second))
	cfg.RuntimeParams["tcp_keepalives_interval"] = strconv.Itoa(int(c.KeepalivesInterval / time.Second))
	cfg.RuntimeParams["tcp_keepalives_count"] = strconv.Itoa(c.KeepalivesCount)
	cfg.RuntimeParams["tcp_user_timeout"] = strconv.Itoa(int(c.TCPUserTimeout / time.Millisecond))
	// Only a NOTIFY assigns a transaction id here; its commit need not wait
	// for the WAL flush.
	cfg.RuntimeParams["synchronous_commit"] = "off"
	cfg.OnNotification = onNotify
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	dial := cfg.DialFunc
	ka := net.KeepAliveConfig{Enable: true, Idle: c.KeepalivesIdle, Interval: c.KeepalivesInterval, Count: c.KeepalivesCount}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if tc, ok := conn.(*net.TCPConn); ok && err == nil {
			_ = tc.SetKeepAliveConfig(ka) // best effort; the server side matters most
		}
		return conn, err
	}
	return pgconn.ConnectConfig(ctx, cfg)
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
	args, next := "$1", 2
	if space == pglocks.SpaceInt32Pair {
		args, next = "$1, $2", 3
	}
	mode := ""
	if shared {
		mode = "_shared"
	}
	notify := fmt.Sprintf("pg_notify($%d, $%d)", next, next+1)
	switch kind {
	case stmtTry:
		if want {
			sql = "select l, case when not l then " + notify + " end from pg_try_advisory_lock" + mode + "(" + args + ") as l"
		} else {
			sql = "select pg_try_advisory_lock" + mode + "(" + args + ")"
		}
	case stmtUnlock:
		sql = "select pg_advisory_unlock" + mode + "(" + args + ")"
	case stmtUnlockNotify:
		sql = "select pg_advisory_unlock" + mode + "(" + args + "), " + notify
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
