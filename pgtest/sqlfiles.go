package pgtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"

	"github.com/jackc/pgx/v5"
)

// SQLFiles is a [Migrator] of plain SQL files: those of fsys matching
// pattern (a [path.Match] pattern such as "migrations/*.sql"), run in the
// lexical order of their names, each in a transaction of its own. Its Hash
// is a digest of the names and contents of those files, so that changing,
// adding or removing one makes a new template. A file that fails names
// itself in the error.
func SQLFiles(fsys fs.FS, pattern string) Migrator {
	return sqlFiles{fsys: fsys, pattern: pattern}
}

type sqlFiles struct {
	fsys    fs.FS
	pattern string
}

// files returns the matching names, sorted, or an error when there are none.
func (m sqlFiles) files() ([]string, error) {
	if m.fsys == nil {
		return nil, errors.New("pgtest: SQLFiles: nil file system")
	}
	if _, err := path.Match(m.pattern, ""); err != nil {
		return nil, fmt.Errorf("pgtest: SQLFiles: pattern %q: %w", m.pattern, err)
	}
	names, err := fs.Glob(m.fsys, m.pattern)
	if err != nil {
		return nil, fmt.Errorf("pgtest: SQLFiles: %w", err)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("pgtest: SQLFiles: no file matches %q", m.pattern)
	}
	sort.Strings(names)
	return names, nil
}

// Hash digests every matching file's name and content.
func (m sqlFiles) Hash() (string, error) {
	names, err := m.files()
	if err != nil {
		return "", err
	}
	return HashFiles(m.fsys, "sql", names)
}

// HashFiles returns a digest of kind (which keeps two adapters reading the
// same files apart) and of the names and contents of files in fsys: the
// Hash of a [Migrator] of files.
func HashFiles(fsys fs.FS, kind string, names []string) (string, error) {
	if fsys == nil {
		return "", errors.New("pgtest: hash files: nil file system")
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00", kind)
	for _, name := range names {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return "", fmt.Errorf("pgtest: hash %s: %w", name, err)
		}
		fmt.Fprintf(h, "%d:%s\x00%d:", len(name), name, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Migrate runs the files in order.
func (m sqlFiles) Migrate(ctx context.Context, conn *pgx.Conn) error {
	if conn == nil || ctx == nil {
		return errors.New("pgtest: SQLFiles: nil connection or context")
	}
	names, err := m.files()
	if err != nil {
		return err
	}
	for _, name := range names {
		b, err := fs.ReadFile(m.fsys, name)
		if err != nil {
			return fmt.Errorf("migration %s: %w", name, err)
		}
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, string(b))
			return err
		}); err != nil {
			return fmt.Errorf("migration %s: %w", name, err)
		}
	}
	return nil
}

// RandomToken returns 16 random hex digits: a comment that makes a
// migration set unique to one test, when a test must make its own template.
func RandomToken() string { return randomHex(8) }
