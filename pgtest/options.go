package pgtest

import (
	"context"
	"os"

	"github.com/jackc/pgx/v5"
)

// DefaultImage is the Docker image used when neither [WithImage] nor
// PGTEST_IMAGE names one.
const DefaultImage = "postgres:16-alpine"

// DefaultMaxConnections is the max_connections of a throwaway server unless
// [WithMaxConnections] says otherwise: enough for stress tests that open
// hundreds of sessions.
const DefaultMaxConnections = 500

// Option configures [Start], [Main] and [NewServer].
type Option func(*config)

type config struct {
	dsn      string
	image    string
	docker   bool
	maxConns int
	settings []string // "name=value", after the defaults
	// syncStandby makes a Cluster's standby synchronous.
	syncStandby bool
	setup       func(ctx context.Context, conn *pgx.Conn) error
	migrator    Migrator
	private     bool // never share the binary's local server (share.go)
}

func newConfig(opts []Option) config {
	c := config{
		dsn:      os.Getenv("PGTEST_DSN"),
		image:    envOr("PGTEST_IMAGE", DefaultImage),
		docker:   os.Getenv("PGTEST_DOCKER") != "0",
		maxConns: DefaultMaxConnections,
	}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// WithDSN uses the running server dsn (a superuser connection string)
// instead of reading PGTEST_DSN. An empty dsn means: start a throwaway server.
func WithDSN(dsn string) Option { return func(c *config) { c.dsn = dsn } }

// WithImage sets the Docker image for [ModeDocker]. Default: PGTEST_IMAGE,
// else [DefaultImage].
func WithImage(image string) Option { return func(c *config) { c.image = image } }

// WithoutDocker skips Docker even when a daemon answers, as PGTEST_DOCKER=0
// does.
func WithoutDocker() Option { return func(c *config) { c.docker = false } }

// WithMaxConnections sets max_connections of a throwaway server. Default:
// [DefaultMaxConnections].
func WithMaxConnections(n int) Option { return func(c *config) { c.maxConns = n } }

// WithSetting sets a server configuration parameter of a throwaway server
// (postgres -c name=value), after and over pgtest's own defaults: for
// example WithSetting("max_locks_per_transaction", "10") for a test of a
// small lock table. A name or value PostgreSQL refuses makes the server
// fail to start, with its error. A server given by PGTEST_DSN or
// [WithDSN] is used as it is: the settings are ignored there.
func WithSetting(name, value string) Option {
	return func(c *config) { c.settings = append(c.settings, name+"="+value) }
}

// settingArgs returns the "-c name=value" arguments of cfg's settings.
func (c config) settingArgs() []string {
	var args []string
	for _, s := range c.settings {
		args = append(args, "-c", s)
	}
	return args
}

// WithTemplate runs setup once, on the template database that every
// per-test database is cloned from: migrate a schema there once, and every
// test starts with it.
func WithTemplate(setup func(ctx context.Context, conn *pgx.Conn) error) Option {
	return func(c *config) { c.setup = setup }
}
