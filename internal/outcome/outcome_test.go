package outcome_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/outcome"
	"github.com/pglocks/pglocks/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is what the cases need: a database, its superuser DSN, and a login
// role without privileges.
type env struct {
	t    *testing.T
	db   *pgtest.DB
	role string
}

func (e env) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	e.t.Cleanup(cancel)
	return ctx
}

func (e env) connect(dsn string) (*pgx.Conn, error) {
	conn, err := pgx.Connect(e.ctx(), dsn)
	if err == nil {
		e.t.Cleanup(func() { _ = conn.Close(context.Background()) })
	}
	return conn, err
}

func (e env) admin() *pgx.Conn { return e.db.Conn(e.t) }

func (e env) asRole() *pgx.Conn {
	conn, err := e.connect(withUser(e.t, e.db.DSN, e.role, "right"))
	if err != nil {
		e.t.Fatal(err)
	}
	return conn
}

func exec(e env, conn *pgx.Conn, sql string) error {
	_, err := conn.Exec(e.ctx(), sql)
	return err
}

func withUser(t *testing.T, dsn, user, password string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable&connect_timeout=5",
		user, password, net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port)), cfg.Database)
}

var roleSeq atomic.Int64

// newRole creates a login role with password "right" on db's server.
func newRole(t *testing.T, db *pgtest.DB, options string) string {
	t.Helper()
	role := fmt.Sprintf("outcome_role_%d_%d", time.Now().UnixNano(), roleSeq.Add(1))
	conn := db.Conn(t)
	if _, err := conn.Exec(context.Background(), "create role "+role+" login password 'right' "+options); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), db.DSN)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "select pg_terminate_backend(pid) from pg_stat_activity where usename = $1", role)
		_, _ = c.Exec(context.Background(), "drop owned by "+role+"; drop role "+role)
	})
	return role
}

// A real server produces each error of the table; Of classifies it.
func TestOfRealErrors(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	e := env{t: t, db: db, role: newRole(t, db, "")}
	if err := exec(e, e.admin(), "create table guarded (id int primary key, v int); insert into guarded values (1, 0)"); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		want outcome.Class
		code string // the SQLSTATE the server must have given, if any
		make func(e env) error
	}{
		{"Success", outcome.OK, "", func(e env) error { return exec(e, e.admin(), "select 1") }},
		{"MissingRole", outcome.Fatal, "28000", func(e env) error {
			_, err := e.connect(withUser(e.t, e.db.DSN, "no_such_role_q", "x"))
			return err
		}},
		{"MissingDatabase", outcome.Fatal, "3D000", func(e env) error {
			cfg, _ := pgx.ParseConfig(e.db.DSN)
			_, err := e.connect(fmt.Sprintf("postgres://postgres@%s:%d/no_such_db_q?sslmode=disable", cfg.Host, cfg.Port))
			return err
		}},
		{"MissingTable", outcome.Fatal, "42P01", func(e env) error { return exec(e, e.admin(), "select * from no_such_table") }},
		{"Privilege", outcome.Fatal, "42501", func(e env) error { return exec(e, e.asRole(), "select * from guarded") }},
		{"ReadOnly", outcome.Fatal, "25006", func(e env) error {
			conn := e.admin()
			_ = exec(e, conn, "begin read only")
			defer exec(e, conn, "rollback")
			return exec(e, conn, "update guarded set v = v + 1")
		}},
		{"DivisionByZero", outcome.Fatal, "22012", func(e env) error { return exec(e, e.admin(), "select 1/0") }},
		{"NotSupported", outcome.Fatal, "0A000", func(e env) error {
			return exec(e, e.admin(), "create temp table subq (a int check (a in (select 1)))")
		}},
		{"SerializationFailure", outcome.Retry, "40001", serializationFailure},
		{"Deadlock", outcome.Retry, "40P01", deadlock},
		{"NoWait", outcome.Busy, "55P03", func(e env) error {
			holder := e.admin()
			_ = exec(e, holder, "begin")
			defer exec(e, holder, "rollback")
			if err := exec(e, holder, "select * from guarded for update"); err != nil {
				return err
			}
			return exec(e, e.admin(), "select * from guarded for update nowait")
		}},
		{"StatementTimeout", outcome.Retry, "57014", func(e env) error {
			conn := e.admin()
			_ = exec(e, conn, "set statement_timeout = '20ms'")
			return exec(e, conn, "select pg_sleep(5)")
		}},
		{"TooManyConnectionsForRole", outcome.Retry, "53300", func(e env) error {
			role := newRole(e.t, e.db, "connection limit 1")
			if _, err := e.connect(withUser(e.t, e.db.DSN, role, "right")); err != nil {
				return fmt.Errorf("first connection: %w", err)
			}
			_, err := e.connect(withUser(e.t, e.db.DSN, role, "right"))
			return err
		}},
		{"TerminatedMidStatement", outcome.Unknown, "57P01", terminatedMidStatement},
		{"RefusedDial", outcome.Retry, "", func(e env) error {
			ln, _ := net.Listen("tcp", "127.0.0.1:0")
			addr := ln.Addr().String()
			_ = ln.Close()
			_, err := e.connect("postgres://postgres@" + addr + "/x?sslmode=disable")
			return err
		}},
		{"ClosedPool", outcome.Fatal, "", func(e env) error {
			pool, err := pgxpool.New(e.ctx(), e.db.DSN)
			if err != nil {
				return err
			}
			pool.Close()
			_, err = pool.Exec(e.ctx(), "select 1")
			return err
		}},
		{"ContextDoneBeforeSend", outcome.Retry, "", func(e env) error {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, err := e.admin().Exec(ctx, "select 1")
			return err
		}},
		{"ContextCancelledMidStatement", outcome.Unknown, "", func(e env) error {
			conn := e.admin() // connected before the ctx starts: its end must find the statement sent
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			_, err := conn.Exec(ctx, "select pg_sleep(5)")
			return err
		}},
		{"MarkedFatal", outcome.Fatal, "", func(env) error { return fmt.Errorf("op: %w", outcome.MarkFatal(errors.New("closed"))) }},
		{"MarkedInvalid", outcome.Fatal, "", func(env) error { return fmt.Errorf("op: %w", outcome.MarkInvalid(errors.New("n > limit"))) }},
		{"NotSentContext", outcome.Retry, "", func(env) error {
			return fmt.Errorf("op: %w", outcome.MarkNotSent(fmt.Errorf("queued: %w", context.Canceled)))
		}},
		{"NotSentClosedPool", outcome.Fatal, "", func(e env) error {
			pool := e.db.NewPool(e.t)
			pool.Close()
			_, err := pool.Acquire(context.Background())
			return outcome.MarkNotSent(err)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := env{t: t, db: db, role: e.role}
			err := c.make(e)
			t.Logf("%v", err)
			if got := outcome.SQLState(err); got != c.code {
				t.Fatalf("SQLSTATE %q, want %q: the case did not produce its error", got, c.code)
			}
			if got := outcome.Of(err); got != c.want {
				t.Errorf("Of = %v, want %v", got, c.want)
			}
		})
	}
}

// serializationFailure updates a row that a concurrent transaction
// changed since this repeatable-read transaction's snapshot.
func serializationFailure(e env) error {
	a, b := e.admin(), e.admin()
	_ = exec(e, a, "begin isolation level repeatable read")
	defer exec(e, a, "rollback")
	if err := exec(e, a, "select * from guarded"); err != nil {
		return err
	}
	if err := exec(e, b, "update guarded set v = v + 1 where id = 1"); err != nil {
		return err
	}
	return exec(e, a, "update guarded set v = v + 1 where id = 1")
}

// deadlock makes two transactions wait for each other's advisory locks.
func deadlock(e env) error {
	a, b := e.admin(), e.admin()
	for _, c := range []*pgx.Conn{a, b} {
		_ = exec(e, c, "set deadlock_timeout = '10ms'")
		_ = exec(e, c, "begin")
		defer exec(e, c, "rollback")
	}
	_ = exec(e, a, "select pg_advisory_xact_lock(1)")
	_ = exec(e, b, "select pg_advisory_xact_lock(2)")
	errs := make(chan error, 2)
	go func() { errs <- exec(e, a, "select pg_advisory_xact_lock(2)") }()
	go func() { errs <- exec(e, b, "select pg_advisory_xact_lock(1)") }()
	return errors.Join(<-errs, <-errs) // one of them is chosen as the victim
}

// terminatedMidStatement ends a session with pg_terminate_backend while its
// statement runs: the reply never comes.
func terminatedMidStatement(e env) error {
	conn := e.admin()
	pid := conn.PgConn().PID()
	errc := make(chan error, 1)
	go func() { errc <- exec(e, conn, "select pg_sleep(30)") }()
	admin := e.admin()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var active bool
		if err := admin.QueryRow(e.ctx(), "select state = 'active' from pg_stat_activity where pid = $1", int32(pid)).Scan(&active); err != nil {
			return err
		}
		if active || time.Now().After(deadline) {
			break
		}
		tick := time.NewTimer(10 * time.Millisecond)
		<-tick.C
	}
	if err := exec(e, admin, fmt.Sprintf("select pg_terminate_backend(%d)", pid)); err != nil {
		return err
	}
	return <-errc
}

// A wrong password is Fatal: 28P01 from a server that asks for one.
func TestOfWrongPassword(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := srv.RequirePasswords(ctx); err != nil {
		t.Fatal(err)
	}
	db := srv.NewDB(t)
	role := newRole(t, db, "")
	_, err := pgx.Connect(ctx, withUser(t, db.DSN, role, "wrong"))
	t.Logf("%v", err)
	if got := outcome.SQLState(err); got != "28P01" {
		t.Fatalf("SQLSTATE %q, want 28P01", got)
	}
	if got := outcome.Of(err); got != outcome.Fatal {
		t.Errorf("Of = %v, want fatal", got)
	}
}

// TestLockTableFull: a real full lock table — on a server with the
// smallest max_locks_per_transaction — is named by LockTableFull, for a
// statement and for a new connection, and stays Retry; another 53200 is
// not a full lock table.
func TestLockTableFull(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t, pgtest.WithMaxConnections(10),
		pgtest.WithSetting("max_locks_per_transaction", "10"), pgtest.WithSetting("autovacuum", "off"))
	db := srv.NewDB(t)
	e := env{t: t, db: db}
	filler, conn := e.admin(), e.admin()
	// Session locks outlive the statement that fails when the table is full.
	full := exec(e, filler, "select count(pg_advisory_lock(k)) from generate_series(1, 10000000) k")
	t.Cleanup(func() { _ = exec(e, filler, "select pg_advisory_unlock_all()") })
	_, dialErr := e.connect(db.DSN)
	for name, err := range map[string]error{
		"Filler": full, "Statement": exec(e, conn, "select pg_try_advisory_lock(0)"), "Dial": dialErr,
	} {
		if !outcome.LockTableFull(err) || outcome.Of(err) != outcome.Retry {
			t.Errorf("%s: %v: LockTableFull %t, class %v; want true, retry", name, err, outcome.LockTableFull(err), outcome.Of(err))
		}
	}
	for _, err := range []error{nil, errors.New("out of shared memory"),
		&pgconn.PgError{Severity: "ERROR", Code: "53200", Message: "out of memory"},
		&pgconn.PgError{Severity: "ERROR", Code: "53300", Message: "too many connections"},
	} {
		if outcome.LockTableFull(err) {
			t.Errorf("LockTableFull(%v) = true", err)
		}
	}
}

// TestInvalid: only an error marked with MarkInvalid, however wrapped, is
// Invalid; the mark keeps errors.Is and the message, and is Fatal.
func TestInvalid(t *testing.T) {
	t.Parallel()
	cause := errors.New("n = 4 is above the limit 3")
	err := fmt.Errorf("op: %w", outcome.MarkInvalid(cause))
	if !outcome.Invalid(err) || !errors.Is(err, cause) || err.Error() != "op: n = 4 is above the limit 3" {
		t.Errorf("marked: Invalid %v, errors.Is %v, message %q", outcome.Invalid(err), errors.Is(err, cause), err)
	}
	if outcome.Of(err) != outcome.Fatal {
		t.Errorf("Of = %v, want fatal", outcome.Of(err))
	}
	for _, e := range []error{nil, cause, outcome.MarkFatal(cause), outcome.MarkNotSent(cause)} {
		if outcome.Invalid(e) {
			t.Errorf("Invalid(%v) = true, want false", e)
		}
	}
	if outcome.MarkInvalid(nil) != nil {
		t.Error("MarkInvalid(nil) != nil")
	}
}
