package pgtest

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// NewBouncer starts a [Bouncer] in mode (with opts) in front of s for one
// test, closed when the test ends. When pgbouncer is not installed it skips the test,
// unless the CI environment variable is set: in CI it fails.
func NewBouncer(t testing.TB, s *Server, mode PoolMode, opts ...BouncerOption) *Bouncer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := StartBouncer(ctx, s, mode, opts...)
	if errors.Is(err, ErrNoBouncer) && os.Getenv("CI") == "" {
		t.Skipf("%v; skipping outside CI", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

// Bouncer starts a [Bouncer] in mode (with opts) in front of the database's server for
// one test (see [NewBouncer]) and returns it with a DSN that connects to the
// database through it.
func (d *DB) Bouncer(t testing.TB, mode PoolMode, opts ...BouncerOption) (b *Bouncer, dsn string) {
	t.Helper()
	b = NewBouncer(t, d.Server, mode, opts...)
	dsn, err := b.DSN(d.DSN)
	if err != nil {
		t.Fatal(err)
	}
	return b, dsn
}

// NewPool opens a pool on dsn — for instance a [Bouncer]'s — closed when the
// test ends, like [DB.NewPool].
func NewPool(t testing.TB, dsn string, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	return newPool(t, dsn, configure)
}

// NewPgpool starts a [Pgpool] in front of s for one test (see
// [StartPgpool]), closed when the test ends. When pgpool is not installed
// it skips the test, unless the CI environment variable is set: in CI it
// fails.
func NewPgpool(t testing.TB, s *Server, cache bool) *Pgpool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := StartPgpool(ctx, s, cache)
	if errors.Is(err, ErrNoPgpool) && os.Getenv("CI") == "" {
		t.Skipf("%v; skipping outside CI", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// Pgpool starts a [Pgpool] in front of the database's server for one test
// (see [NewPgpool]) and returns it with a DSN that connects to the
// database through it.
func (d *DB) Pgpool(t testing.TB, cache bool) (p *Pgpool, dsn string) {
	t.Helper()
	p = NewPgpool(t, d.Server, cache)
	dsn, err := p.DSN(d.DSN)
	if err != nil {
		t.Fatal(err)
	}
	return p, dsn
}
