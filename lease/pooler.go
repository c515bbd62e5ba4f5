package lease

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/pooler"
)

// modalPool is the store's pool. Its Exec, Query and QueryRow run the
// store's statements in an exec mode that works behind the pooler in front
// of the server, if any: a pool that caches prepared statements or
// describes them in a round trip of their own (pgx's default
// QueryExecModeCacheStatement, and QueryExecModeDescribeExec) fails behind
// a pooler in transaction mode, where the next statement may run on a
// server session that never saw the statement or that another client
// prepared it on. Behind a pooler the store's statements use
// QueryExecModeExec instead (one round trip, an unnamed statement); over a
// direct connection they keep the pool's own mode.
type modalPool struct {
	*pgxpool.Pool
	def pgx.QueryExecMode // the pool's
	m   *execMode
	t   *tableRef // explains the errors of statements on the table (setup.go)
}

// execMode is decided once per store, on its first statement.
type execMode struct {
	mu    sync.Mutex
	known bool
	over  bool // statements run in QueryExecModeExec
}

func newModalPool(pool *pgxpool.Pool, cfg Config) modalPool {
	cc := pool.Config().ConnConfig
	return modalPool{Pool: pool, def: cc.DefaultQueryExecMode, m: &execMode{}, t: newTableRef(cfg, cc)}
}

// Exec is pgxpool.Pool.Exec in the store's exec mode.
func (p modalPool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := p.Pool.Exec(ctx, sql, p.args(ctx, args)...)
	return tag, p.t.explain(sql, err)
}

// Query is pgxpool.Pool.Query in the store's exec mode.
func (p modalPool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := p.Pool.Query(ctx, sql, p.args(ctx, args)...)
	return explainedRows{Rows: rows, t: p.t, sql: sql}, p.t.explain(sql, err)
}

// QueryRow is pgxpool.Pool.QueryRow in the store's exec mode.
func (p modalPool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return explainedRow{row: p.Pool.QueryRow(ctx, sql, p.args(ctx, args)...), t: p.t, sql: sql}
}

// args returns args with the exec mode in front when the store overrides
// the pool's.
func (p modalPool) args(ctx context.Context, args []any) []any {
	return p.argsOn(ctx, nil, args)
}

// argsOn is args for a statement on c (nil: any connection of the pool).
func (p modalPool) argsOn(ctx context.Context, c *pgxpool.Conn, args []any) []any {
	if !p.override(ctx, c) {
		return args
	}
	return append([]any{pgx.QueryExecModeExec}, args...)
}

// override reports whether statements must run in QueryExecModeExec. Pools
// in a mode that keeps no statement across transactions never do. Others
// are probed once: a pooled connection whose startup process id is not its
// backend's is behind a pooler. A failed probe overrides this once, and is
// repeated next time.
func (p modalPool) override(ctx context.Context, c *pgxpool.Conn) bool {
	switch p.def {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheDescribe:
		return false
	}
	p.m.mu.Lock()
	defer p.m.mu.Unlock()
	if p.m.known {
		return p.m.over
	}
	if c == nil {
		var err error
		if c, err = p.Pool.Acquire(ctx); err != nil {
			return true
		}
		defer c.Release()
	}
	pc := c.Conn().PgConn()
	pid, err := pooler.BackendPID(ctx, pc)
	if err != nil {
		return true
	}
	p.m.known, p.m.over = true, pid != pc.PID()
	return p.m.over
}

// txArgs returns args for a statement in the caller's transaction tx: in
// QueryExecModeExec when tx's connection caches prepared statements across
// transactions, which a pooler in transaction mode breaks.
// A tx with no *pgx.Conn behind it (an adapter, such as package stdsql's
// for database/sql) keeps its own mode.
func txArgs(tx pgx.Tx, args []any) []any {
	c := tx.Conn()
	if c == nil {
		return args
	}
	switch c.Config().DefaultQueryExecMode {
	case pgx.QueryExecModeCacheStatement:
		return append([]any{pgx.QueryExecModeExec}, args...)
	}
	return args
}

// pooled reports whether the store's connections were found to reach the
// server through a pooler: then a connection's PID() is the pooler's, not
// a server backend's.
func (p modalPool) pooled() bool {
	p.m.mu.Lock()
	defer p.m.mu.Unlock()
	return p.m.known && p.m.over
}

// on returns c, a connection of the pool, as a querier in the store's
// exec mode; a probe the mode still needs runs on c itself, so that a
// store holding its pool's last connection cannot wait for another.
func (p modalPool) on(c *pgxpool.Conn) querier { return modalConn{c: c, p: p} }

// modalConn is a pool connection whose statements run in the store's mode.
type modalConn struct {
	c *pgxpool.Conn
	p modalPool
}

// Query is pgxpool.Conn.Query in the store's exec mode.
func (m modalConn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := m.c.Query(ctx, sql, m.p.argsOn(ctx, m.c, args)...)
	return explainedRows{Rows: rows, t: m.p.t, sql: sql}, m.p.t.explain(sql, err)
}

// QueryRow is pgxpool.Conn.QueryRow in the store's exec mode.
func (m modalConn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return explainedRow{row: m.c.QueryRow(ctx, sql, m.p.argsOn(ctx, m.c, args)...), t: m.p.t, sql: sql}
}

// pollInterval is how often a waiting Acquire tries again when the store
// cannot LISTEN (behind a pooler in transaction mode, notifications never
// reach it): with jitter, between 0.5 and 1.5 times this.
const pollInterval = 200 * time.Millisecond

// polls reports whether the listener found it cannot listen.
func (lis *listener) polls() bool {
	lis.mu.Lock()
	defer lis.mu.Unlock()
	return lis.polling
}

// pollWait caps a waiter's wait at the poll interval when the store polls.
func (lis *listener) pollWait(wait time.Duration) time.Duration {
	if lis == nil || !lis.polls() {
		return wait
	}
	return min(wait, pollInterval/2+rand.N(pollInterval))
}

// startPolling records that notifications cannot arrive and sets every
// waiter free to poll.
func (lis *listener) startPolling() {
	lis.mu.Lock()
	defer lis.mu.Unlock()
	lis.polling = true
	for _, set := range lis.waiters {
		for w := range set {
			w.settle()
			poke(w.wake)
		}
	}
}
