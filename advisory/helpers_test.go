package advisory_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/pgtest"
)

// lazyPool returns a pool on dsn that opens no connection up front, so a
// server that rejects the pool's connections is seen by the Locker only.
func lazyPool(t testing.TB, dsn string, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MinConns = 0
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// withUser returns dsn with its user (and password) replaced.
func withUser(t testing.TB, dsn, user, password string) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable&connect_timeout=5",
		user, password, net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port)), cfg.Database)
}

// closedAddr returns a local TCP address on which nothing listens.
func closedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// rejecter is a server that accepts TCP connections and closes them at
// once, counting them: a database that is down behind a live address.
type rejecter struct {
	ln    net.Listener
	count atomic.Int64
}

func newRejecter(t testing.TB) *rejecter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &rejecter{ln: ln}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.count.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return r
}

var roleSeq atomic.Int64

// createRole makes a login role with the given ALTER ROLE settings, dropped
// at cleanup, and returns its name.
func createRole(t testing.TB, db *pgtest.DB, settings ...string) string {
	t.Helper()
	ctx := ctxT(t)
	conn := db.Conn(t)
	role := fmt.Sprintf("pglocks_role_%d_%d", time.Now().UnixNano(), roleSeq.Add(1))
	if _, err := conn.Exec(ctx, "create role "+pgx.Identifier{role}.Sanitize()+" login password 'right'"); err != nil {
		t.Fatal(err)
	}
	for _, s := range settings {
		if _, err := conn.Exec(ctx, "alter role "+pgx.Identifier{role}.Sanitize()+" set "+s); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, db.DSN)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close(ctx)
		_, _ = c.Exec(ctx, "select pg_terminate_backend(pid) from pg_stat_activity where usename = $1", role)
		if _, err := c.Exec(ctx, "drop owned by "+pgx.Identifier{role}.Sanitize()+"; drop role "+pgx.Identifier{role}.Sanitize()); err != nil {
			t.Logf("drop role %s: %v", role, err)
		}
	})
	return role
}
