// Package pgtestgoose makes goose migrations a [pgtest.Migrator]: the
// template every test database is cloned from is migrated by goose once
// per server and migration set, and reused by later test binaries and runs.
//
//	var migrations embed.FS // with //go:embed migrations/*.sql
//
//	func TestMain(m *testing.M) {
//		fsys, _ := fs.Sub(migrations, "migrations")
//		pgtest.Main(m, pgtest.WithMigrator(pgtestgoose.New(fsys)))
//	}
//
// The Hash is a digest of the names and contents of every file at the root
// of fsys (where goose looks). Go migrations registered with goose are not
// files: their changes do not change the Hash; give them a file of their
// own to edit with them, or wrap the Migrator to add their version to Hash.
package pgtestgoose

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pressly/goose/v3"
)

// New returns a Migrator that runs goose's Up with the migrations of fsys
// (its root directory) and the given provider options.
func New(fsys fs.FS, opts ...goose.ProviderOption) pgtest.Migrator {
	return migrator{fsys: fsys, opts: opts}
}

type migrator struct {
	fsys fs.FS
	opts []goose.ProviderOption
}

// Hash digests the names and contents of the files at fsys's root.
func (m migrator) Hash() (string, error) {
	if m.fsys == nil {
		return "", errors.New("pgtestgoose: nil file system")
	}
	entries, err := fs.ReadDir(m.fsys, ".")
	if err != nil {
		return "", fmt.Errorf("pgtestgoose: %w", err)
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	return pgtest.HashFiles(m.fsys, "goose", names)
}

// Migrate runs goose up on the database conn is connected to, through a
// database/sql handle of its own (closed before it returns). A failed
// migration's error names its file.
func (m migrator) Migrate(ctx context.Context, conn *pgx.Conn) error {
	if m.fsys == nil || conn == nil || ctx == nil {
		return errors.New("pgtestgoose: nil file system, connection or context")
	}
	db := stdlib.OpenDB(*conn.Config())
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, m.fsys, m.opts...)
	if err != nil {
		return fmt.Errorf("goose: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		var pe *goose.PartialError
		if errors.As(err, &pe) && pe.Failed != nil && pe.Failed.Source != nil {
			return fmt.Errorf("goose migration %s: %w", pe.Failed.Source.Path, err)
		}
		return fmt.Errorf("goose: %w", err)
	}
	return nil
}
