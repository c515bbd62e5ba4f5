package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Mode says where a [Server] came from.
type Mode string

const (
	// ModeDSN is a server the caller runs, named by PGTEST_DSN or [WithDSN].
	// pgtest creates and drops databases on it but never stops or restarts it.
	ModeDSN Mode = "dsn"
	// ModeDocker is a throwaway container started through dockertest.
	ModeDocker Mode = "docker"
	// ModeLocal is a throwaway cluster run from local PostgreSQL binaries.
	ModeLocal Mode = "local"
)

// ErrUnsupported is returned by operations the server's [Mode] cannot do,
// such as [Server.Restart] on a [ModeDSN] server.
var ErrUnsupported = errors.New("pgtest: not supported in this mode")

// Server is one PostgreSQL server: either the caller's (PGTEST_DSN) or a
// throwaway one that pgtest started and will remove. It is safe for
// concurrent use.
type Server struct {
	mode     Mode
	cfg      config
	adminDSN string     // superuser, maintenance database
	ownMu    sync.Mutex // held while making the run's own template
	template string     // the run's own template, once made; under ownMu
	version  int        // server_version_num
	runID    string     // outlives(): in every database name this run makes (see sweep.go)

	backend  backend      // nil in ModeDSN
	shared   bool         // a local server shared by the test binaries of one go test (share.go)
	unshared error        // why a test binary's local server is its own, not shared
	runLock  *runLock     // outlives(): this run's lock session (see runlock.go)
	pooled   bool         // ModeDSN: the DSN goes through a pooler: no sweep
	nextPort atomic.Int32 // when not 0, the port of the next pooler in front of s (see pickPort)

	mu        sync.Mutex
	templates map[string]*tplState // by template name
	pools     map[string]*dbPool   // by template name
	kept      map[string]struct{}  // databases of failed tests
	txDBs     map[string]*txDB     // NewTx's databases, by template
	retiredTx []*txDB              // NewTx's databases a test committed to
	admin     *pgxpool.Pool        // see adminExec
	stopping  chan struct{}        // closed by Close: pools stop filling

	closeOnce sync.Once
	closeErr  error
}

// backend is what a throwaway server needs besides a DSN.
type backend interface {
	restart(ctx context.Context) error
	close() error
	describe() string
}

// Start returns a running server, found in this order: a DSN ([WithDSN],
// else the PGTEST_DSN environment variable); a Docker container when a
// Docker daemon answers (image from [WithImage], else PGTEST_IMAGE, else
// postgres:16-alpine); a cluster from local PostgreSQL binaries (initdb and
// postgres on PATH, in `pg_config --bindir`, or /usr/lib/postgresql/*/bin).
// When none works the error names all three ways and why each failed.
//
// ctx bounds only the start. Call [Server.Close] when done: it removes a
// throwaway server, its files and its container. Should the process die
// first — a panic, a test timeout, SIGINT or SIGKILL — a small watchdog
// process started alongside removes them instead.
func Start(ctx context.Context, opts ...Option) (*Server, error) {
	return start(ctx, newConfig(opts), false)
}

// start is [Start]; with share, a local server is the one shared by the
// test binaries of this go test (share.go) when this process may share.
func start(ctx context.Context, cfg config, share bool) (*Server, error) {
	if cfg.dsn != "" {
		return startDSN(ctx, cfg)
	}
	var why []string
	if cfg.docker {
		s, err := startDocker(ctx, cfg)
		if err == nil {
			return s, nil
		}
		why = append(why, "Docker: "+err.Error())
		if !errors.Is(err, errNoDaemon) && !errors.Is(err, errNoImage) {
			logf("Docker: %v; falling back to local binaries", err)
		}
	} else {
		why = append(why, "Docker: disabled by PGTEST_DOCKER=0")
	}
	var unshared error
	if share {
		s, err := startShared(ctx, cfg)
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errNoShare) {
			if ctx.Err() != nil {
				return nil, err
			}
			logf("%v; starting a local server of this test binary's own", err)
		}
		unshared = err
	}
	s, err := startLocal(ctx, cfg)
	if err == nil {
		s.unshared = unshared
		return s, nil
	}
	why = append(why, "local binaries: "+err.Error())
	return nil, fmt.Errorf("pgtest: no PostgreSQL server: set PGTEST_DSN to use a running server, "+
		"start a Docker daemon, or install PostgreSQL binaries (initdb, postgres); tried:\n  - PGTEST_DSN: not set\n  - %s",
		strings.Join(why, "\n  - "))
}

func startDSN(ctx context.Context, cfg config) (*Server, error) {
	s := newServer(ModeDSN, cfg, cfg.dsn, nil)
	if err := s.init(ctx); err != nil {
		return nil, fmt.Errorf("pgtest: PGTEST_DSN server %s: %w", redact(cfg.dsn), err)
	}
	return s, nil
}

func newServer(mode Mode, cfg config, adminDSN string, b backend) *Server {
	return &Server{mode: mode, cfg: cfg, adminDSN: adminDSN, backend: b, runID: randomHex(4),
		templates: map[string]*tplState{}, pools: map[string]*dbPool{}, kept: map[string]struct{}{},
		stopping: make(chan struct{})}
}

// outlives reports whether the server outlives this run and serves
// others meanwhile: a PGTEST_DSN server, or a local one shared by the test
// binaries of one go test.
func (s *Server) outlives() bool { return s.mode == ModeDSN || s.shared }

// init takes the run's lock on a server that outlives the run (see
// sweep.go), then initDBs. A private throwaway server's databases go with
// it: no lock, no run id in their names, nothing for a sweep to match.
func (s *Server) init(ctx context.Context) error {
	if !s.outlives() {
		return s.initDBs(ctx)
	}
	if err := s.holdRunLock(ctx); err != nil {
		return err
	}
	if err := s.initDBs(ctx); err != nil {
		_ = s.releaseRunLock()
		return err
	}
	return nil
}

// initDBs connects, reads the server version, checks that the role may
// create databases, sweeps what dead runs left (outlives), and makes the
// default template: the [WithMigrator] one, shared by hash, or one of this
// run's own that the [WithTemplate] setup fills.
func (s *Server) initDBs(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.adminDSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var super, createdb bool
	if err := conn.QueryRow(ctx, `select current_setting('server_version_num')::int, rolsuper, rolcreatedb
		from pg_roles where rolname = current_user`).Scan(&s.version, &super, &createdb); err != nil {
		return err
	}
	if !super && !createdb {
		return errors.New("the role may not create databases: pgtest needs a superuser, or at least a role with CREATEDB")
	}
	if s.outlives() {
		s.sweep(ctx, conn)
	}
	if s.cfg.migrator == nil && s.cfg.setup == nil {
		return nil // an empty template, made when first needed
	}
	_, err = s.templateFor(ctx, nil)
	return err
}

// templateFor returns the template a database of opts is cloned from: the
// template of opts' [WithMigrator], else of the server's, else this run's
// own (empty, or as [WithTemplate] left it), each made on first use.
func (s *Server) templateFor(ctx context.Context, opts []Option) (string, error) {
	m := dbConfig(opts).migrator
	if m == nil {
		m = s.cfg.migrator
	}
	if m != nil {
		return s.migratedTemplate(ctx, m)
	}
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	if s.template == "" {
		if err := s.ownTemplate(ctx); err != nil {
			return "", err
		}
	}
	return s.template, nil
}

// ownTemplate creates this run's template and runs the WithTemplate setup.
// A template half made is dropped.
func (s *Server) ownTemplate(ctx context.Context) (err error) {
	conn, err := pgx.Connect(ctx, s.adminDSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	template := s.dbName("template")
	if _, err := conn.Exec(ctx, "create database "+pgx.Identifier{template}.Sanitize()); err != nil {
		return fmt.Errorf("create template database: %w", explainCreate(err))
	}
	if s.cfg.setup == nil {
		s.template = template
		return nil
	}
	defer func() {
		if err != nil {
			_ = s.dropWith(context.WithoutCancel(ctx), conn, template)
		} else {
			s.template = template
		}
	}()
	tconn, err := pgx.Connect(ctx, s.ConnString(template))
	if err != nil {
		return err
	}
	defer tconn.Close(context.WithoutCancel(ctx))
	if err := s.cfg.setup(ctx, tconn); err != nil {
		return fmt.Errorf("template setup: %w", err)
	}
	return nil
}

// Mode reports where the server came from.
func (s *Server) Mode() Mode { return s.mode }

// Version returns the server's server_version_num, e.g. 150004.
func (s *Server) Version() int { return s.version }

// DSN returns a superuser connection string for the server's maintenance
// database.
func (s *Server) DSN() string { return s.adminDSN }

// ConnString returns the server's superuser connection string with the
// database replaced by dbname.
func (s *Server) ConnString(dbname string) string { return withDatabase(s.adminDSN, dbname) }

// String describes the server for logs, without passwords.
func (s *Server) String() string {
	if s.backend != nil {
		return string(s.mode) + " " + s.backend.describe()
	}
	return string(s.mode) + " " + redact(s.adminDSN)
}

// Restart stops the server and starts it again on the same address, which
// drops every session (a fast shutdown: backends are terminated, nothing is
// lost that was committed). It returns once the server accepts connections.
// A [ModeDSN] server, or one shared by the test binaries of a go test (see
// [SharedServer]), cannot be restarted: the error wraps [ErrUnsupported].
func (s *Server) Restart(ctx context.Context) error {
	if err := s.wholeServer("restart"); err != nil {
		return err
	}
	if err := s.backend.restart(ctx); err != nil {
		return fmt.Errorf("pgtest: restart: %w", err)
	}
	s.resetAdmin() // the restart ended its sessions
	return nil
}

// wholeServer returns an error wrapping [ErrUnsupported] for op, which
// acts on the whole server, on a server that serves others too.
func (s *Server) wholeServer(op string) error {
	switch {
	case s.backend == nil:
		return fmt.Errorf("pgtest: %s a %s server: %w", op, s.mode, ErrUnsupported)
	case s.shared:
		return fmt.Errorf("pgtest: %s a server shared by the test binaries of go test "+
			"(use NewServer for a private one): %w", op, ErrUnsupported)
	}
	return nil
}

// Close removes a throwaway server with its files or container. On a
// server that outlives the run — a [ModeDSN] one, or a local one shared by
// the test binaries of a go test (see [SharedServer]) — it drops this run's
// databases (its template, the clones made ahead, but for a failed test's
// database) but not the templates of [WithMigrator], which later runs
// reuse; a shared server is then removed by its watchdog once the go
// command has exited and no test binary uses it. It is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		close(s.stopping)
		s.mu.Unlock()
		s.stopPools()
		s.closeTxPools()
		s.closeAdmin()
		if !s.outlives() {
			s.closeErr = s.backend.close()
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// Drop first, then release the lock: a sweep never sees this run
		// dead with its databases still there.
		s.closeErr = s.dropRun(ctx)
		s.closeErr = errors.Join(s.closeErr, s.releaseRunLock())
		if s.backend != nil { // shared: let it go
			s.closeErr = errors.Join(s.closeErr, s.backend.close())
		}
	})
	return s.closeErr
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// withDatabase returns dsn with its database replaced. dsn is a URL or a
// keyword/value string.
func withDatabase(dsn, dbname string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + dbname
		return u.String()
	}
	return dsn + " dbname='" + strings.ReplaceAll(strings.ReplaceAll(dbname, `\`, `\\`), "'", `\'`) + "'"
}

// redact hides the password of a URL DSN.
func redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
		return u.String()
	}
	return dsn
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
