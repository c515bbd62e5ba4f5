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
	"time"

	"github.com/jackc/pgx/v5"
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
	adminDSN string // superuser, maintenance database
	template string // database every CreateDatabase clones
	version  int    // server_version_num

	backend backend // nil in ModeDSN

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
	cfg := newConfig(opts)
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
	s, err := startLocal(ctx, cfg)
	if err == nil {
		return s, nil
	}
	why = append(why, "local binaries: "+err.Error())
	return nil, fmt.Errorf("pgtest: no PostgreSQL server: set PGTEST_DSN to use a running server, "+
		"start a Docker daemon, or install PostgreSQL binaries (initdb, postgres); tried:\n  - PGTEST_DSN: not set\n  - %s",
		strings.Join(why, "\n  - "))
}

func startDSN(ctx context.Context, cfg config) (*Server, error) {
	s := &Server{mode: ModeDSN, cfg: cfg, adminDSN: cfg.dsn}
	// Other test binaries may share this server; give ours its own template.
	if err := s.init(ctx, "pgtest_tpl_"+randomHex(6)); err != nil {
		return nil, fmt.Errorf("pgtest: PGTEST_DSN server %s: %w", redact(cfg.dsn), err)
	}
	return s, nil
}

// init connects, reads the server version and creates the template database.
func (s *Server) init(ctx context.Context, template string) error {
	conn, err := pgx.Connect(ctx, s.adminDSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := conn.QueryRow(ctx, "select current_setting('server_version_num')::int").Scan(&s.version); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "create database "+pgx.Identifier{template}.Sanitize()); err != nil {
		return fmt.Errorf("create template database: %w", err)
	}
	s.template = template
	if s.cfg.setup == nil {
		return nil
	}
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
// A [ModeDSN] server cannot be restarted: the error wraps [ErrUnsupported].
func (s *Server) Restart(ctx context.Context) error {
	if s.backend == nil {
		return fmt.Errorf("restart %s: %w", s.mode, ErrUnsupported)
	}
	if err := s.backend.restart(ctx); err != nil {
		return fmt.Errorf("pgtest: restart: %w", err)
	}
	return nil
}

// Close removes a throwaway server with its files or container, or for a
// [ModeDSN] server drops the template database. It is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		if s.backend != nil {
			s.closeErr = s.backend.close()
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s.closeErr = s.dropDatabase(ctx, s.template)
	})
	return s.closeErr
}

// Database is one database on a [Server], as made by [Server.CreateDatabase].
type Database struct {
	// Name is the database's name.
	Name string
	// DSN connects to it as superuser.
	DSN string

	server *Server
}

// CreateDatabase creates a fresh database, a clone of the server's template
// (empty, or as the [WithTemplate] setup left it). Drop it with
// [Database.Drop].
func (s *Server) CreateDatabase(ctx context.Context) (*Database, error) {
	name := "pgtest_" + randomHex(6)
	conn, err := pgx.Connect(ctx, s.adminDSN)
	if err != nil {
		return nil, fmt.Errorf("pgtest: create database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	sql := "create database " + pgx.Identifier{name}.Sanitize() + " template " + pgx.Identifier{s.template}.Sanitize()
	if s.version >= 150000 {
		// FILE_COPY copies a small template faster than the default
		// WAL_LOG strategy, which writes every page to WAL.
		sql += " strategy file_copy"
	}
	if _, err := conn.Exec(ctx, sql); err != nil {
		return nil, fmt.Errorf("pgtest: create database: %w", err)
	}
	return &Database{Name: name, DSN: s.ConnString(name), server: s}, nil
}

// Drop drops the database, terminating any sessions still connected to it.
func (d *Database) Drop(ctx context.Context) error {
	return d.server.dropDatabase(ctx, d.Name)
}

func (s *Server) dropDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, s.adminDSN)
	if err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	sql := "drop database if exists " + pgx.Identifier{name}.Sanitize()
	if s.version >= 130000 {
		sql += " with (force)"
	}
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", name, err)
	}
	return nil
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
