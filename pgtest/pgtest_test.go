package pgtest_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv("PGTEST_CHILD_FAULT") != "" {
		os.Exit(teardownChildMain(m))
	}
	goleak.VerifyTestMain(pgtest.WrapMain(m))
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func currentDatabase(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var name string
	if err := conn.QueryRow(ctxT(t, 30*time.Second), "select current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}

func TestNew(t *testing.T) {
	t.Parallel()
	testNew(t, pgtest.SharedServer(t))
}

// testNew proves per-test databases on srv: fresh, isolated, dropped.
func testNew(t *testing.T, srv *pgtest.Server) {
	t.Run("FreshDatabase", func(t *testing.T) {
		t.Parallel()
		db := srv.NewDB(t)
		if got := currentDatabase(t, db.Conn(t)); got != db.Name {
			t.Fatalf("connected to %q, want %q", got, db.Name)
		}
	})
	t.Run("Isolated", func(t *testing.T) {
		t.Parallel()
		a, b := srv.NewDB(t), srv.NewDB(t)
		if a.Name == b.Name {
			t.Fatalf("two tests share database %q", a.Name)
		}
		ctx := ctxT(t, 30*time.Second)
		if _, err := a.Conn(t).Exec(ctx, "create table only_in_a (x int)"); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := b.Conn(t).QueryRow(ctx, "select count(*) from pg_class where relname = 'only_in_a'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatal("a table created in one test's database is visible in another's")
		}
	})
	t.Run("DroppedAtCleanup", func(t *testing.T) {
		t.Parallel()
		var name string
		t.Run("Inner", func(t *testing.T) { name = srv.NewDB(t).Name })
		var exists bool
		admin := connect(t, srv.DSN())
		if err := admin.QueryRow(ctxT(t, 30*time.Second),
			"select exists(select 1 from pg_database where datname = $1)", name).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if exists {
			t.Fatalf("database %s survived its test", name)
		}
	})
	t.Run("Pool", func(t *testing.T) {
		t.Parallel()
		db := srv.NewDB(t)
		pool := db.NewPool(t)
		var one int
		if err := pool.QueryRow(ctxT(t, 30*time.Second), "select 1").Scan(&one); err != nil || one != 1 {
			t.Fatalf("select 1 through the pool: %v, %d", err, one)
		}
	})
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctxT(t, 30*time.Second), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func pgtestConnect(ctx context.Context, dsn string) (*pgx.Conn, error) { return pgx.Connect(ctx, dsn) }

func backendPID(t *testing.T, conn *pgx.Conn) uint32 {
	t.Helper()
	return conn.PgConn().PID()
}

func TestTerminateBackend(t *testing.T) {
	t.Parallel()
	testTerminateBackend(t, pgtest.SharedServer(t))
}

func testTerminateBackend(t *testing.T, srv *pgtest.Server) {
	db := srv.NewDB(t)
	victim, bystander := db.Conn(t), db.Conn(t)
	ctx := ctxT(t, 30*time.Second)
	if err := db.Server.TerminateBackend(ctx, backendPID(t, victim)); err != nil {
		t.Fatal(err)
	}
	if _, err := victim.Exec(ctx, "select 1"); err == nil {
		t.Fatal("a terminated backend's next query succeeded")
	}
	if _, err := bystander.Exec(ctx, "select 1"); err != nil {
		t.Fatalf("another session was hurt: %v", err)
	}
	if err := db.Server.TerminateBackend(ctx, backendPID(t, victim)); err == nil {
		t.Fatal("terminating a backend that is gone succeeded")
	}
}

func TestTerminateApplication(t *testing.T) {
	t.Parallel()
	testTerminateApplication(t, pgtest.SharedServer(t))
}

func testTerminateApplication(t *testing.T, srv *pgtest.Server) {
	db := srv.NewDB(t)
	app := "pgtest-victim-" + db.Name
	var victims []*pgx.Conn
	for range 3 {
		cfg, err := pgx.ParseConfig(db.DSN)
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["application_name"] = app
		conn, err := pgx.ConnectConfig(ctxT(t, 30*time.Second), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		victims = append(victims, conn)
	}
	ctx := ctxT(t, 30*time.Second)
	n, err := db.Server.TerminateApplication(ctx, app)
	if err != nil {
		t.Fatal(err)
	}
	if n != len(victims) {
		t.Fatalf("terminated %d backends, want %d", n, len(victims))
	}
	for _, v := range victims {
		if _, err := v.Exec(ctx, "select 1"); err == nil {
			t.Fatal("a terminated backend's next query succeeded")
		}
	}
}

func TestRestartDropsEverySession(t *testing.T) {
	t.Parallel()
	testRestart(t, pgtest.NewServer(t, pgtest.WithoutDocker()))
}

// testRestart proves Restart on srv, which no other test may be using: every
// session is dropped, committed data survives, the address stays.
func testRestart(t *testing.T, srv *pgtest.Server) {
	db := srv.NewDB(t)
	before := db.Conn(t)
	ctx := ctxT(t, 2*time.Minute)
	if _, err := before.Exec(ctx, "create table survives (x int); insert into survives values (42)"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := before.Exec(ctx, "select 1"); err == nil {
		t.Fatal("a session survived the restart")
	}
	var x int
	if err := db.Conn(t).QueryRow(ctx, "select x from survives").Scan(&x); err != nil || x != 42 {
		t.Fatalf("after restart: %v, x=%d", err, x)
	}
}

func TestRestartUnsupportedWithDSN(t *testing.T) {
	t.Parallel()
	srv := pgtest.SharedServer(t)
	ctx := ctxT(t, 30*time.Second)
	s, err := pgtest.Start(ctx, pgtest.WithDSN(srv.DSN()))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Mode() != pgtest.ModeDSN {
		t.Fatalf("mode %s, want dsn", s.Mode())
	}
	if err := s.Restart(ctx); !errors.Is(err, pgtest.ErrUnsupported) {
		t.Fatalf("Restart on a DSN server: %v, want ErrUnsupported", err)
	}
}

func TestTemplateSetup(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t, pgtest.WithoutDocker(), pgtest.WithTemplate(func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "create table from_template (x int)")
		return err
	}))
	db := srv.NewDB(t)
	var n int
	if err := db.Conn(t).QueryRow(ctxT(t, 30*time.Second),
		"select count(*) from pg_class where relname = 'from_template'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatal("a per-test database lacks the template's table")
	}
}

// BenchmarkCreateDatabase measures what every test pays for its own
// database: a clone of the template, and its drop.
func BenchmarkCreateDatabase(b *testing.B) {
	srv := pgtest.SharedServer(b)
	ctx := context.Background()
	for b.Loop() {
		d, err := srv.CreateDatabase(ctx)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := d.Drop(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkStartServer measures starting a throwaway local server.
func BenchmarkStartServer(b *testing.B) {
	for b.Loop() {
		s, err := pgtest.Start(context.Background(), pgtest.WithDSN(""), pgtest.WithoutDocker())
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
