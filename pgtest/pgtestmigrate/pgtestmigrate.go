// Package pgtestmigrate makes golang-migrate migrations a
// [pgtest.Migrator]: the template every test database is cloned from is
// migrated once per server and migration set, and reused by later test
// binaries and runs.
//
//	var migrations embed.FS // with //go:embed migrations/*.sql
//
//	func TestMain(m *testing.M) {
//		pgtest.Main(m, pgtest.WithMigrator(pgtestmigrate.New(migrations, "migrations")))
//	}
//
// The Hash is a digest of the names and contents of every file in the
// directory dir of fsys (where golang-migrate looks).
package pgtestmigrate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pglocks/pglocks/pgtest"
)

// New returns a Migrator that runs golang-migrate's Up with the migrations
// in the directory dir of fsys ("." for its root).
func New(fsys fs.FS, dir string) pgtest.Migrator {
	return migrator{fsys: fsys, dir: dir}
}

type migrator struct {
	fsys fs.FS
	dir  string
}

// Hash digests the names and contents of the files in dir.
func (m migrator) Hash() (string, error) {
	if m.fsys == nil {
		return "", errors.New("pgtestmigrate: nil file system")
	}
	entries, err := fs.ReadDir(m.fsys, m.dir)
	if err != nil {
		return "", fmt.Errorf("pgtestmigrate: %w", err)
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() {
			names = append(names, path.Join(m.dir, e.Name()))
		}
	}
	return pgtest.HashFiles(m.fsys, "golang-migrate", names)
}

// Migrate runs the up migrations on the database conn is connected to,
// through a database/sql handle of its own (closed before it returns). A
// failed migration's error names its file.
func (m migrator) Migrate(ctx context.Context, conn *pgx.Conn) error {
	if m.fsys == nil || conn == nil || ctx == nil {
		return errors.New("pgtestmigrate: nil file system, connection or context")
	}
	src, err := iofs.New(m.fsys, m.dir)
	if err != nil {
		return fmt.Errorf("golang-migrate: %w", err)
	}
	db := stdlib.OpenDB(*conn.Config())
	defer db.Close()
	drv, err := migratepgx.WithInstance(db, &migratepgx.Config{})
	if err != nil {
		return fmt.Errorf("golang-migrate: %w", err)
	}
	mg, err := migrate.NewWithInstance("iofs", src, "pgx5", drv)
	if err != nil {
		return fmt.Errorf("golang-migrate: %w", err)
	}
	defer mg.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			mg.GracefulStop <- true
		case <-done:
		}
	}()
	if err := mg.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("golang-migrate%s: %w", m.failed(mg), err)
	}
	return nil
}

// failed names the file of the migration left dirty, if any.
func (m migrator) failed(mg *migrate.Migrate) string {
	v, dirty, err := mg.Version()
	if err != nil || !dirty {
		return ""
	}
	names, _ := fs.Glob(m.fsys, path.Join(m.dir, fmt.Sprintf("%d_*.up.*", v)))
	if len(names) == 1 {
		return " migration " + names[0]
	}
	return fmt.Sprintf(" migration %d", v)
}
