package pgtest

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The one server of this test binary, started by the first New.
var shared struct {
	mu      sync.Mutex
	opts    []Option
	started bool
	server  *Server
	err     error
}

// Main runs the tests of a package and then removes the package's server,
// and exits with the tests' status. Use it as the whole of TestMain; opts
// configure the server that [New] starts on first use.
func Main(m *testing.M, opts ...Option) {
	os.Exit(WrapMain(m, opts...).Run())
}

// WrapMain returns m with a Run that also removes the package's server (and
// the Example functions' server of [ExampleDSN]) once the tests have run. Use it where TestMain hands m to something else, such
// as goleak.VerifyTestMain(pgtest.WrapMain(m)), which then checks for leaked
// goroutines after pgtest's own are gone.
func WrapMain(m *testing.M, opts ...Option) interface{ Run() int } {
	shared.mu.Lock()
	shared.opts = opts
	shared.mu.Unlock()
	return mainRunner{m}
}

type mainRunner struct{ m *testing.M }

func (r mainRunner) Run() int {
	code := r.m.Run()
	if err := CloseExampleServer(); err != nil {
		os.Stderr.WriteString("pgtest: " + err.Error() + "\n")
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.server != nil {
		if err := shared.server.Close(); err != nil {
			os.Stderr.WriteString("pgtest: " + err.Error() + "\n")
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// SharedServer returns the server of this test binary, starting it on first
// use; every [New] database lives on it. In -short mode without PGTEST_DSN
// it skips the test instead of starting a server.
//
// A local server (no PGTEST_DSN, no Docker) is shared by the test binaries
// that one go command runs, when their options for it are alike: the
// first one starts it, the others find it, and its watchdog removes it
// once the go command has exited and no test binary uses it. Each binary
// then uses it as a PGTEST_DSN server: its databases carry its run's id,
// and [Server.Restart] and [Server.RequirePasswords] return
// [ErrUnsupported] (use [NewServer]). PGTEST_SHARE=0, or
// [WithPrivateServer] among [Main]'s options, gives the binary a server of
// its own.
func SharedServer(t testing.TB) *Server {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.started {
		if testing.Short() && newConfig(shared.opts).dsn == "" {
			t.Skip("pgtest: -short and no PGTEST_DSN: skipping a test that needs PostgreSQL")
		}
		shared.started = true
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		begin := time.Now()
		shared.server, shared.err = start(ctx, newConfig(shared.opts), true)
		if shared.err == nil {
			t.Logf("pgtest: %s ready in %v", shared.server, time.Since(begin).Round(time.Millisecond))
			if b, ok := shared.server.backend.(*sharedBackend); ok {
				t.Logf("pgtest: this test binary %s", b.joined())
			} else if err := shared.server.unshared; err != nil {
				t.Logf("pgtest: this test binary's server is its own, not shared with the other test binaries of go test: %v", err)
			}
		}
	}
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.server
}

// New gives the test a fresh database on the package's server (see
// [SharedServer]) and drops it when the test ends. The database is a clone
// of the server's template, or with [WithMigrator] among opts of that
// migrator's template (made on first use); other options configure servers
// and are ignored here. A failed test's database is kept, and its DSN
// logged, for as long as the server lives: the test binary's own server is
// removed when the binary exits; with PGTEST_DSN, until a later run's sweep.
func New(t testing.TB, opts ...Option) *DB {
	t.Helper()
	return SharedServer(t).NewDB(t, opts...)
}

// NewPool opens a pool on the database, closed when the test ends. Each
// configure function may change the pool's config first (MaxConns,
// application_name, …).
func (d *DB) NewPool(t testing.TB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	return newPool(t, d.DSN, configure)
}

func newPool(t testing.TB, dsn string, configure []func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range configure {
		f(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Conn opens one connection to the database, closed when the test ends.
func (d *DB) Conn(t testing.TB) *pgx.Conn {
	t.Helper()
	return connect(t, d.DSN)
}

func connect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// NewServer starts a private throwaway server for one test, removed when the
// test ends: for tests that restart the server, which would break every
// other test on the shared one. The options given to [Main] or [WrapMain]
// apply first, then opts. It skips the test when PGTEST_DSN is set (pgtest
// cannot start servers beside yours) or in -short mode.
func NewServer(t testing.TB, opts ...Option) *Server {
	t.Helper()
	if testing.Short() {
		t.Skip("pgtest: -short: skipping a test that starts its own server")
	}
	shared.mu.Lock()
	opts = append(append([]Option(nil), shared.opts...), opts...)
	shared.mu.Unlock()
	cfg := newConfig(opts)
	if cfg.dsn != "" {
		t.Skip("pgtest: PGTEST_DSN is set: a test needing its own server is skipped")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// NewDB is [New] on server s instead of the shared one.
func (s *Server) NewDB(t testing.TB, opts ...Option) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := s.CreateDatabase(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			s.keep(t, d)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := d.Drop(ctx); err != nil {
			t.Error(err)
		}
	})
	return d
}

// keep leaves a failed test's database for a look, and says until when.
func (s *Server) keep(t testing.TB, d *DB) {
	s.mu.Lock()
	s.kept[d.Name] = struct{}{}
	s.mu.Unlock()
	if s.mode == ModeDSN {
		t.Logf("pgtest: test failed; its database stays on the PGTEST_DSN server until a later run's sweep drops it: %s", redact(d.DSN))
		return
	}
	if s.shared {
		t.Logf("pgtest: test failed; its database stays on the server shared by this go test's test binaries until "+
			"the server is removed after go test ends, or a later test binary's sweep drops it: %s", redact(d.DSN))
		return
	}
	t.Logf("pgtest: test failed; its database stays as long as its throwaway server, which is removed when the test "+
		"binary ends (a NewServer server: when its test ends); with PGTEST_DSN it would outlive the run: %s", redact(d.DSN))
}
