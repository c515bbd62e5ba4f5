package pgtest

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Migrator makes a schema: the migrations a user's suite runs once per
// server into a template that every test's database is cloned from.
// Adapters: [SQLFiles] here, pgtestgoose for goose, pgtestmigrate for
// golang-migrate.
type Migrator interface {
	// Hash identifies the migrations: two Migrators with the same Hash
	// make the same schema. A digest of the migration files is right;
	// pgtest names the template by it and reuses that template, across
	// test binaries and runs, whenever the same Hash comes again.
	Hash() (string, error)
	// Migrate runs the migrations on conn, connected to a fresh, empty
	// database. Its error should name the migration that failed.
	Migrate(ctx context.Context, conn *pgx.Conn) error
}

// Checksummer is what a [Migrator] whose Hash is a name rather than a digest
// of its migrations (a version, a release tag) should also be: Checksum is
// that digest. pgtest stores it with the template, and a later Migrator that
// declares the same Hash with another Checksum gets an error naming both,
// instead of a template made by other migrations. Without it, the Hash is
// the checksum.
type Checksummer interface {
	Checksum() (string, error)
}

// WithMigrator makes m's template the one databases are cloned from:
// given to [Main], [Start] or [NewServer], for every database of that
// server; given to [New], [Server.NewDB] or [Server.CreateDatabase], for
// that database. The template is made once per server and Hash, under an
// advisory lock, so that concurrent test binaries wait for one migration
// rather than each running its own; later binaries and runs on the same
// server (PGTEST_DSN) reuse it. A migration that fails fails the test
// with its error, and the half-made template is dropped: no one reuses it.
func WithMigrator(m Migrator) Option { return func(c *config) { c.migrator = m } }

// tplState is one template's making in this process, shared by every
// caller that needs it.
type tplState struct {
	done chan struct{}
	sum  string
	err  error
}

// Advisory lock spaces (the first key of the two-key form) of pgtest's
// locks on the maintenance database.
const (
	runLockSpace = 0x70677472 // a run's lifetime lock, see sweep.go
	tplLockSpace = 0x70677474 // making a template
)

// templatePrefix begins the name of every template made by a Migrator.
const templatePrefix = "pgtest_tpl_"

// templateName is the database name of the template of hash.
func templateName(hash string) string {
	return templatePrefix + digest(hash)[:24]
}

// templateMark is the comment a template gets once its migrations ran: its
// presence is what makes a template complete.
func templateMark(hash, sum string) string {
	return "pgtest template " + digest(hash) + " " + digest(sum)[:16]
}

func digest(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// lockKey is the second advisory lock key of name.
func lockKey(name string) int32 {
	h := sha256.Sum256([]byte(name))
	return int32(binary.BigEndian.Uint32(h[:4]))
}

// migratedTemplate returns the name of m's template on s, made by this
// call or an earlier one, in this process or another.
func (s *Server) migratedTemplate(ctx context.Context, m Migrator) (string, error) {
	hash, sum, err := migratorKeys(m)
	if err != nil {
		return "", err
	}
	name := templateName(hash)
	s.mu.Lock()
	st, found := s.templates[name]
	if !found {
		st = &tplState{done: make(chan struct{}), sum: sum}
		s.templates[name] = st
	}
	s.mu.Unlock()
	if !found {
		st.err = s.buildTemplate(ctx, name, hash, sum, m)
		if st.err != nil && ctx.Err() != nil {
			s.mu.Lock()
			delete(s.templates, name) // cut short: the next caller tries again
			s.mu.Unlock()
		}
		close(st.done)
	}
	select {
	case <-st.done:
	case <-ctx.Done():
		return "", fmt.Errorf("pgtest: template %s: %w", name, context.Cause(ctx))
	}
	if st.err == nil && st.sum != sum {
		return "", collision(hash)
	}
	return name, st.err
}

func migratorKeys(m Migrator) (hash, sum string, err error) {
	if hash, err = m.Hash(); err != nil {
		return "", "", fmt.Errorf("pgtest: migrator: hash: %w", err)
	}
	if hash == "" {
		return "", "", errors.New("pgtest: migrator: empty hash")
	}
	sum = hash
	if c, ok := m.(Checksummer); ok {
		if sum, err = c.Checksum(); err != nil {
			return "", "", fmt.Errorf("pgtest: migrator: checksum: %w", err)
		}
	}
	return hash, sum, nil
}

func collision(hash string) error {
	return fmt.Errorf("pgtest: two different migration sets declare the hash %q: "+
		"the template of that hash was made by migrations with another checksum", hash)
}

// buildTemplate makes the template name unless a complete one is there,
// holding the template's advisory lock throughout (so that binaries on the
// same maintenance database wait for one migration). The migrations run
// on a database of this run, which gets its completion mark and is then
// renamed to name: under name a template is always complete, whoever made
// it and whatever database they connect to; one left half made by a run
// that died carries that run's id, and the sweep drops it.
func (s *Server) buildTemplate(ctx context.Context, name, hash, sum string, m Migrator) error {
	conn, err := pgx.Connect(ctx, s.adminDSN)
	if err != nil {
		return fmt.Errorf("pgtest: template %s: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Session lock; it goes with the connection however this ends.
	if _, err := conn.Exec(ctx, "select pg_catalog.pg_advisory_lock($1::int4, $2::int4)", tplLockSpace, lockKey(name)); err != nil {
		return fmt.Errorf("pgtest: template %s: lock: %w", name, err)
	}
	if done, err := s.templateThere(ctx, conn, name, hash, sum); done || err != nil {
		return err
	}
	work := s.dbName(randomHex(6))
	if _, err := conn.Exec(ctx, "create database "+pgx.Identifier{work}.Sanitize()); err != nil {
		return fmt.Errorf("pgtest: template %s: %w", name, explainCreate(err))
	}
	err = s.migrateInto(ctx, work, m)
	if err != nil {
		err = fmt.Errorf("pgtest: migrate template %s: %w", name, err)
	} else if _, cerr := conn.Exec(ctx, "comment on database "+pgx.Identifier{work}.Sanitize()+" is '"+templateMark(hash, sum)+"'"); cerr != nil {
		err = fmt.Errorf("pgtest: template %s: mark complete: %w", name, cerr)
	} else if _, rerr := conn.Exec(ctx, "alter database "+pgx.Identifier{work}.Sanitize()+" rename to "+pgx.Identifier{name}.Sanitize()); rerr == nil {
		return nil
	} else if !isDuplicateDatabase(rerr) {
		err = fmt.Errorf("pgtest: template %s: %w", name, rerr)
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if derr := s.dropWith(dctx, conn, work); derr != nil {
		return errors.Join(err, derr)
	}
	if err == nil { // another binary, on another maintenance database, made it first
		_, err = s.templateThere(ctx, conn, name, hash, sum)
		return err
	}
	return fmt.Errorf("%w (the half-made template was dropped)", err)
}

// templateThere reports whether the complete template name of (hash, sum)
// is there; one of the same hash and another sum is an error. One without
// a mark, left by an older pgtest that migrated under the final name, is
// dropped.
func (s *Server) templateThere(ctx context.Context, conn *pgx.Conn, name, hash, sum string) (bool, error) {
	var mark *string
	err := conn.QueryRow(ctx, "select shobj_description(oid, 'pg_database') from pg_database where datname = $1", name).Scan(&mark)
	switch {
	case err == nil && mark != nil && *mark == templateMark(hash, sum):
		return true, nil // made before, by this run or another
	case err == nil && mark != nil && strings.HasPrefix(*mark, "pgtest template "+digest(hash)+" "):
		return false, collision(hash)
	case err == nil:
		return false, s.dropWith(ctx, conn, name)
	case !errors.Is(err, pgx.ErrNoRows):
		return false, fmt.Errorf("pgtest: template %s: %w", name, err)
	}
	return false, nil
}

func isDuplicateDatabase(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "42P04" || pe.Code == "23505")
}

// migrateInto runs m on the database name, with its own connection closed
// before it returns (a template with a session cannot be cloned).
func (s *Server) migrateInto(ctx context.Context, name string, m Migrator) error {
	conn, err := pgx.Connect(ctx, s.ConnString(name))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return m.Migrate(ctx, conn)
}
