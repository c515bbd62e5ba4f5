// Package dial opens dedicated connections — ones that never go back to a
// pool, such as a session holding advisory locks or a LISTEN connection —
// the way a pgxpool opens its own: from a copy of the pool's ConnConfig,
// through its BeforeConnect hook (rotated passwords, IAM tokens) and its
// AfterConnect hook. Only application_name is added to the startup packet,
// which every pooler accepts; session settings are sent after connecting,
// and only once a check (a pooler probe) has accepted the connection.
package dial

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Options say how to open one dedicated connection. The zero value opens
// it exactly as the pool would.
type Options struct {
	// ApplicationName, if set, replaces the startup application_name.
	ApplicationName string
	// OnNotification, if set, receives the connection's notifications.
	OnNotification pgconn.NotificationHandler
	// Keepalive, if enabled, is set on the client's TCP socket.
	Keepalive net.KeepAliveConfig
	// DeadlineInterrupt makes ctx interrupt a statement by a socket
	// deadline, which leaves the connection usable, rather than by a cancel
	// request on a new TCP connection (pgx's default).
	DeadlineInterrupt bool
	// Check, if set, judges the connection once the backend's pid is known
	// (Conn.BackendPID, Conn.InRecovery) and before Settings and
	// IdleSessionTimeout are sent: a pooler probe, say. If it fails the
	// connection is closed, the dial fails with its error as is, and no
	// setting was sent — behind a transaction-mode pooler a SET would stay
	// on a server session that other clients use next.
	Check func(ctx context.Context, c Conn) error
	// Settings, if set, returns SQL (simple protocol, any number of
	// statements, no rows) run once connected (and checked) and before
	// anything else; if it fails the connection is closed and the dial
	// fails.
	Settings func(pc *pgconn.PgConn) string
	// IdleSessionTimeout, if positive, is set as the session's
	// idle_session_timeout after Settings, on PostgreSQL 14 and later
	// (older servers have no such setting: nothing is sent). See
	// [Heartbeat] for a connection that waits for notifications.
	IdleSessionTimeout time.Duration
	// Pin, if a TCP address, sends a connection of a multi-host config to
	// that address only: the hosts that resolve to its IP are dialled at
	// its port, the others skipped (a host that does not answer is not
	// waited for). A config with one host, or none resolving to its IP (a
	// DialFunc that goes elsewhere), is dialled as it is. For a second
	// connection that must reach the server a first one reached.
	Pin net.Addr
}

// Conn is a dedicated connection and the process id of the server backend
// behind it, read with pg_backend_pid(): behind a pooler, the connection's
// own PID() is the pooler's invention.
type Conn struct {
	*pgx.Conn
	BackendPID uint32
	// InRecovery is pg_is_in_recovery() as the connection found it: the
	// server is a standby.
	InRecovery bool
}

// Dedicated opens a connection as pool would (see the package doc) with o.
// Errors from the hooks name the hook.
func Dedicated(ctx context.Context, pool *pgxpool.Config, o Options) (Conn, error) {
	cfg := pool.ConnConfig.Copy()
	if pool.BeforeConnect != nil {
		if err := pool.BeforeConnect(ctx, cfg); err != nil {
			return Conn{}, fmt.Errorf("BeforeConnect: %w", err)
		}
	}
	if o.ApplicationName != "" {
		if cfg.RuntimeParams == nil {
			cfg.RuntimeParams = map[string]string{}
		}
		cfg.RuntimeParams["application_name"] = o.ApplicationName
	}
	if o.OnNotification != nil {
		cfg.OnNotification = o.OnNotification
	}
	if o.DeadlineInterrupt {
		cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
		}
	}
	if pin, ok := o.Pin.(*net.TCPAddr); ok {
		pinTo(ctx, cfg, pin)
	}
	if o.Keepalive.Enable {
		dial, ka := cfg.DialFunc, o.Keepalive
		cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dial(ctx, network, addr)
			if tc, ok := conn.(*net.TCPConn); ok && err == nil {
				_ = tc.SetKeepAliveConfig(ka) // best effort; the server side matters most
			}
			return conn, err
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return Conn{}, err
	}
	if pool.AfterConnect != nil {
		if err := pool.AfterConnect(ctx, conn); err != nil {
			_ = conn.Close(ctx)
			return Conn{}, fmt.Errorf("AfterConnect: %w", err)
		}
	}
	c, err := o.settle(ctx, conn)
	if err != nil {
		_ = conn.Close(ctx)
		return Conn{}, err
	}
	return c, nil
}

// settle reads the backend's pid and recovery state and runs the settings:
// in one round trip when there is no Check, else the settings only after
// the Check accepted the connection.
func (o Options) settle(ctx context.Context, conn *pgx.Conn) (Conn, error) {
	pc := conn.PgConn()
	settings := func(pc *pgconn.PgConn) string {
		var parts []string
		if o.Settings != nil {
			parts = append(parts, o.Settings(pc))
		}
		if o.IdleSessionTimeout > 0 {
			parts = append(parts, IdleSessionTimeout(pc, o.IdleSessionTimeout))
		}
		return strings.Join(slices.DeleteFunc(parts, func(p string) bool { return p == "" }), "; ")
	}
	if o.Check == nil {
		c, err := identify(ctx, pc, settings)
		c.Conn = conn
		return c, err
	}
	c, err := identify(ctx, pc, nil)
	if err != nil {
		return Conn{}, err
	}
	c.Conn = conn
	if err := o.Check(ctx, c); err != nil {
		return Conn{}, err
	}
	if o.Settings == nil && o.IdleSessionTimeout <= 0 {
		return c, nil
	}
	if _, err := run(ctx, pc, func() string { return settings(pc) }); err != nil {
		return Conn{}, fmt.Errorf("session settings: %w", err)
	}
	return c, nil
}

// settleTries bounds the runs of the settings that a statement_timeout
// cancels (see run).
const settleTries = 3

// identify reads the backend pid and whether the server is in recovery,
// after the settings if any, in one round trip.
func identify(ctx context.Context, pc *pgconn.PgConn, settings func(*pgconn.PgConn) string) (Conn, error) {
	res, err := run(ctx, pc, func() string {
		sql := "select pg_backend_pid(), pg_is_in_recovery()"
		if settings != nil {
			if s := settings(pc); s != "" {
				sql = s + "; " + sql
			}
		}
		return sql
	})
	if err != nil {
		return Conn{}, fmt.Errorf("session settings: %w", err)
	}
	last := res[len(res)-1]
	if len(last.Rows) != 1 || len(last.Rows[0]) != 2 {
		return Conn{}, fmt.Errorf("session settings: pg_backend_pid() returned %d rows", len(last.Rows))
	}
	pid, err := strconv.ParseUint(string(last.Rows[0][0]), 10, 32)
	if err != nil {
		return Conn{}, fmt.Errorf("session settings: pg_backend_pid() = %q: %w", last.Rows[0][0], err)
	}
	return Conn{BackendPID: uint32(pid), InRecovery: string(last.Rows[0][1]) == "t"}, nil
}

// run runs the SQL sql returns. Its first statement runs under the role's
// or database's statement_timeout (each statement of a simple query is
// timed on its own), so a timeout shorter than a scheduling stall of the
// server can cancel it; nothing took effect then (the statements form one
// implicit transaction), and run runs it again, up to settleTries times in
// all.
func run(ctx context.Context, pc *pgconn.PgConn, sql func() string) ([]*pgconn.Result, error) {
	var (
		res []*pgconn.Result
		err error
	)
	for range settleTries {
		res, err = pc.Exec(ctx, sql()).ReadAll()
		if !cancelledByTimeout(ctx, err) {
			break
		}
	}
	return res, err
}

// Exec runs sql on pc as the settings are run: a statement_timeout that
// cancels its first statement (nothing took effect) is met by running it
// again, up to settleTries times in all.
func Exec(ctx context.Context, pc *pgconn.PgConn, sql string) error {
	_, err := run(ctx, pc, func() string { return sql })
	return err
}

// cancelledByTimeout reports whether err is the server's query_canceled
// while ctx is live: a statement_timeout, not the caller.
func cancelledByTimeout(ctx context.Context, err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "57014" && ctx.Err() == nil
}

// pinTo makes cfg, a multi-host config, dial pin only: of its TCP hosts,
// those that resolve to pin's IP, each at pin's port. A single host, or a
// config none of whose hosts resolves to pin's IP (a DialFunc that goes
// elsewhere, a connector's tunnel), is left as it is.
func pinTo(ctx context.Context, cfg *pgx.ConnConfig, pin *net.TCPAddr) {
	hosts := append([]*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}, cfg.Fallbacks...)
	distinct := map[string]bool{}
	for _, fb := range hosts {
		distinct[net.JoinHostPort(fb.Host, strconv.Itoa(int(fb.Port)))] = true
	}
	if cfg.LookupFunc == nil || len(distinct) < 2 {
		return
	}
	var kept []*pgconn.FallbackConfig
	for _, fb := range hosts {
		if strings.HasPrefix(fb.Host, "/") {
			continue
		}
		ips, err := cfg.LookupFunc(ctx, fb.Host)
		if err != nil {
			continue
		}
		for _, ip := range ips {
			if a := net.ParseIP(ip); a != nil && a.Equal(pin.IP) {
				kept = append(kept, &pgconn.FallbackConfig{Host: ip, Port: uint16(pin.Port), TLSConfig: fb.TLSConfig})
				break
			}
		}
	}
	if len(kept) > 0 {
		cfg.Host, cfg.Port, cfg.TLSConfig, cfg.Fallbacks = kept[0].Host, kept[0].Port, kept[0].TLSConfig, kept[1:]
	}
}
