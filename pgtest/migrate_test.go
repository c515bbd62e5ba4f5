package pgtest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

// counting counts the migrations a Migrator really ran.
type counting struct {
	pgtest.Migrator
	runs *atomic.Int32
}

func (c counting) Migrate(ctx context.Context, conn *pgx.Conn) error {
	c.runs.Add(1)
	return c.Migrator.Migrate(ctx, conn)
}

// migrations are SQL files made unique to one test by token, so that no
// other test or run shares their template.
func migrations(token, second string) fstest.MapFS {
	return fstest.MapFS{
		"m/001_users.sql": {Data: []byte("-- " + token + "\ncreate table users (id int primary key);")},
		"m/002_more.sql":  {Data: []byte(second)},
	}
}

// runOn starts a run (a Server) on the server at dsn, as a test binary
// given PGTEST_DSN does.
func runOn(t *testing.T, dsn string) *pgtest.Server {
	t.Helper()
	s, err := pgtest.Start(ctxT(t, 2*time.Minute), pgtest.WithDSN(dsn))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func templateOID(t *testing.T, dsn string, m pgtest.Migrator) (oid uint32, n int) {
	t.Helper()
	conn := connect(t, dsn)
	hash, err := m.Hash()
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second)
	if err := conn.QueryRow(ctx, `select coalesce(max(oid::int8), 0), count(*) from pg_database
		where shobj_description(oid, 'pg_database') like 'pgtest template %' and datname like 'pgtest\_tpl\_%'
		and datname = any($1)`, []string{pgtest.TemplateNameForTest(hash)}).Scan(&oid, &n); err != nil {
		t.Fatal(err)
	}
	return oid, n
}

// TestMigratorTemplateReused proves that a Migrator's template is made once
// per server and hash: reused by a second run and by another test binary,
// and made anew when a migration file changes.
func TestMigratorTemplateReused(t *testing.T) {
	t.Parallel()
	dsn := pgtest.SharedServer(t).DSN()
	token := pgtest.RandomToken()
	var runs atomic.Int32
	m := counting{pgtest.SQLFiles(migrations(token, "create table orders (id int);"), "m/*.sql"), &runs}
	for run := range 2 {
		s := runOn(t, dsn)
		db, err := s.CreateDatabase(ctxT(t, time.Minute), pgtest.WithMigrator(m))
		if err != nil {
			t.Fatal(err)
		}
		tableCount(t, db.DSN, 2)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if got := runs.Load(); got != 1 {
			t.Fatalf("after run %d: migrations ran %d times, want 1", run+1, got)
		}
	}
	oid, n := templateOID(t, dsn, m)
	if n != 1 {
		t.Fatalf("%d complete templates, want 1", n)
	}
	// Another test binary: this one, as a child.
	cmd := exec.Command(os.Args[0], "-test.run", "^TestMigratorChild$", "-test.v")
	cmd.Env = append(os.Environ(), "PGTEST_CHILD_MIGRATE="+token, "PGTEST_DSN="+dsn)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "migrations ran 0 times") {
		t.Fatalf("child binary: %v\n%s", err, out)
	}
	if again, _ := templateOID(t, dsn, m); again != oid {
		t.Fatalf("the child binary made the template again (oid %d, was %d)", again, oid)
	}
	changed := counting{pgtest.SQLFiles(migrations(token, "create table orders (id int, total int);"), "m/*.sql"), &runs}
	s := runOn(t, dsn)
	defer s.Close()
	if _, err := s.CreateDatabase(ctxT(t, time.Minute), pgtest.WithMigrator(changed)); err != nil {
		t.Fatal(err)
	}
	if got := runs.Load(); got != 2 {
		t.Fatalf("a changed migration file: migrations ran %d times in all, want 2", got)
	}
}

// TestMigratorChild is TestMigratorTemplateReused's other test binary.
func TestMigratorChild(t *testing.T) {
	token := os.Getenv("PGTEST_CHILD_MIGRATE")
	if token == "" {
		t.Skip("helper process of TestMigratorTemplateReused")
	}
	var runs atomic.Int32
	m := counting{pgtest.SQLFiles(migrations(token, "create table orders (id int);"), "m/*.sql"), &runs}
	db := pgtest.New(t, pgtest.WithMigrator(m))
	tableCount(t, db.DSN, 2)
	t.Logf("migrations ran %d times", runs.Load())
}

func tableCount(t *testing.T, dsn string, want int) {
	t.Helper()
	var n int
	if err := connect(t, dsn).QueryRow(ctxT(t, 30*time.Second),
		"select count(*) from pg_tables where schemaname = 'public'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != want {
		t.Fatalf("%d tables, want %d", n, want)
	}
}

// TestMigratorFails proves that a failing migration names itself, and that
// its half-made template is dropped and never reused.
func TestMigratorFails(t *testing.T) {
	t.Parallel()
	srv := pgtest.SharedServer(t)
	bad := pgtest.SQLFiles(migrations(pgtest.RandomToken(), "create table oops (;"), "m/*.sql")
	for range 2 {
		_, err := srv.CreateDatabase(ctxT(t, time.Minute), pgtest.WithMigrator(bad))
		if err == nil || !strings.Contains(err.Error(), "m/002_more.sql") || !strings.Contains(err.Error(), "dropped") {
			t.Fatalf("err = %v, want one naming m/002_more.sql and the dropped template", err)
		}
		if _, n := templateOID(t, srv.DSN(), bad); n != 0 {
			t.Fatal("a half-made template is marked complete")
		}
		// A later run tries again rather than reusing anything.
		next := runOn(t, srv.DSN())
		t.Cleanup(func() { _ = next.Close() })
		srv = next
	}
}

// versioned declares a name as its Hash, and the digest of its migration
// as its Checksum.
type versioned struct {
	version, sql string
}

func (v versioned) Hash() (string, error)     { return v.version, nil }
func (v versioned) Checksum() (string, error) { return v.sql, nil }
func (v versioned) Migrate(ctx context.Context, conn *pgx.Conn) error {
	_, err := conn.Exec(ctx, v.sql)
	return err
}

// TestMigratorCollision proves that two migration sets declaring the same
// hash are told apart by the stored checksum, in a later run as in the same.
func TestMigratorCollision(t *testing.T) {
	t.Parallel()
	srv := pgtest.SharedServer(t)
	version := "release-" + pgtest.RandomToken()
	a := versioned{version, "create table a (x int)"}
	b := versioned{version, "create table b (x int)"}
	if _, err := srv.CreateDatabase(ctxT(t, time.Minute), pgtest.WithMigrator(a)); err != nil {
		t.Fatal(err)
	}
	other := runOn(t, srv.DSN())
	defer other.Close()
	for _, s := range []*pgtest.Server{srv, other} {
		_, err := s.CreateDatabase(ctxT(t, time.Minute), pgtest.WithMigrator(b))
		if err == nil || !strings.Contains(err.Error(), "two different migration sets") {
			t.Fatalf("err = %v, want a hash collision", err)
		}
	}
}

// TestMigratorBadInput proves clear errors for a Migrator without files or
// with a broken pattern.
func TestMigratorBadInput(t *testing.T) {
	t.Parallel()
	srv := pgtest.SharedServer(t)
	for _, tc := range []struct {
		m    pgtest.Migrator
		want string
	}{
		{pgtest.SQLFiles(fstest.MapFS{}, "*.sql"), "no file matches"},
		{pgtest.SQLFiles(fstest.MapFS{}, "[.sql"), "pattern"},
		{pgtest.SQLFiles(nil, "*.sql"), "nil file system"},
		{versioned{"", "select 1"}, "empty hash"},
	} {
		_, err := srv.CreateDatabase(ctxT(t, time.Minute), pgtest.WithMigrator(tc.m))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err = %v, want %q", err, tc.want)
		}
	}
	//lint:ignore SA1012 a nil ctx on purpose
	if _, err := srv.CreateDatabase(nil); err == nil {
		t.Error("nil ctx: no error")
	}
	var nilDB *pgtest.DB
	if err := nilDB.Drop(ctxT(t, time.Second)); err == nil || errors.Is(err, context.Canceled) {
		t.Errorf("nil DB: err = %v", err)
	}
}

// TestMigratorHalfMade proves that a template left half made — created, its
// migrations cut short by a process that died — is dropped and made again,
// never cloned.
func TestMigratorHalfMade(t *testing.T) {
	t.Parallel()
	srv := pgtest.SharedServer(t)
	var runs atomic.Int32
	m := counting{pgtest.SQLFiles(migrations(pgtest.RandomToken(), "create table orders (id int);"), "m/*.sql"), &runs}
	hash, err := m.Hash()
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, time.Minute)
	admin := connect(t, srv.DSN())
	if _, err := admin.Exec(ctx, "create database "+pgx.Identifier{pgtest.TemplateNameForTest(hash)}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	db, err := srv.CreateDatabase(ctx, pgtest.WithMigrator(m))
	if err != nil {
		t.Fatal(err)
	}
	tableCount(t, db.DSN, 2)
	if runs.Load() != 1 {
		t.Fatalf("migrations ran %d times, want 1 (the half-made template remade)", runs.Load())
	}
}

// TestNoCreateDB proves a clear error for a PGTEST_DSN role that may not
// create databases.
func TestNoCreateDB(t *testing.T) {
	t.Parallel()
	srv := pgtest.SharedServer(t)
	role := "pgtest_nocreate_" + pgtest.RandomToken()
	admin := connect(t, srv.DSN())
	ctx := ctxT(t, time.Minute)
	if _, err := admin.Exec(ctx, "create role "+role+" login nocreatedb"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "drop role "+role) })
	cfg, err := pgx.ParseConfig(srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	dsn := strings.Replace(srv.DSN(), "postgres://"+cfg.User+"@", "postgres://"+role+"@", 1)
	_, err = pgtest.Start(ctx, pgtest.WithDSN(dsn))
	if err == nil || !strings.Contains(err.Error(), "may not create databases") {
		t.Fatalf("err = %v, want one saying the role may not create databases", err)
	}
}
