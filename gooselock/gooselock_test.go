package gooselock_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx"
	_ "github.com/lib/pq"              // driver "postgres"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/gooselock"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pressly/goose/v3"
)

// key is the lock every replica of these tests takes.
var key = pglocks.KeyOf("gooselock-test")

// migrations would fail or leave duplicate rows if two replicas ran them:
// version 1 creates a table without "if not exists", and each version adds
// its row to it; version 2 takes a while, so the replicas overlap.
var migrations = fstest.MapFS{
	"00001_applied.sql": {Data: []byte(`-- +goose Up
create table applied (version int not null, pid int not null default pg_backend_pid());
insert into applied (version) values (1);
`)},
	"00002_slow.sql": {Data: []byte(`-- +goose Up
insert into applied (version) values (2);
select pg_sleep(0.2);
`)},
	"00003_widgets.sql": {Data: []byte(`-- +goose Up
create table widgets (id int);
insert into applied (version) values (3);
`)},
}

func openDB(t *testing.T, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func newProvider(t *testing.T, db *sql.DB, opts ...goose.ProviderOption) *goose.Provider {
	t.Helper()
	locker, err := gooselock.New(key)
	if err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations, append(opts, goose.WithSessionLocker(locker))...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// appliedVersions returns the rows of the applied table, ordered.
func appliedVersions(t *testing.T, ctx context.Context, db *sql.DB) []int {
	t.Helper()
	rows, err := db.QueryContext(ctx, "select version from applied order by version")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var vs []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		vs = append(vs, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return vs
}

// TestReplicasMigrateOnce: replicas, each with its own *sql.DB and goose
// Provider, start together and run the same migrations: no error, and
// each migration is applied exactly once, by one replica.
func TestReplicasMigrateOnce(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const replicas = 6
	providers := make([]*goose.Provider, replicas)
	for i := range providers {
		providers[i] = newProvider(t, openDB(t, "pgx", pdb.DSN))
	}
	start := make(chan struct{})
	results := make([][]*goose.MigrationResult, replicas)
	errs := make([]error, replicas)
	took := make([]time.Duration, replicas)
	var wg sync.WaitGroup
	for i, p := range providers {
		wg.Go(func() {
			<-start
			began := time.Now()
			results[i], errs[i] = p.Up(ctx)
			took[i] = time.Since(began)
		})
	}
	close(start)
	wg.Wait()
	var applied []int64
	for i := range providers {
		if errs[i] != nil {
			t.Errorf("replica %d: %v", i, errs[i])
		}
		for _, r := range results[i] {
			applied = append(applied, r.Source.Version)
		}
		t.Logf("replica %d: applied %d migrations in %v", i, len(results[i]), took[i].Round(time.Millisecond))
	}
	slices.Sort(applied)
	if !slices.Equal(applied, []int64{1, 2, 3}) {
		t.Errorf("versions applied by the replicas = %v, want [1 2 3] once each", applied)
	}
	if got := appliedVersions(t, ctx, openDB(t, "pgx", pdb.DSN)); !slices.Equal(got, []int{1, 2, 3}) {
		t.Errorf("rows written by the migrations = %v, want [1 2 3]", got)
	}
}

// TestRefusedBehindTransactionPooling: through PgBouncer in transaction
// mode the Locker refuses with advisory.ErrTransactionPooling and goose
// applies nothing; through a session-mode PgBouncer it migrates.
func TestRefusedBehindTransactionPooling(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgtest.PoolMode{pgtest.PoolTransaction, pgtest.PoolSession} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			pdb := pgtest.New(t)
			_, dsn := pdb.Bouncer(t, mode)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// goose checks its version table before it locks; behind
			// transaction pooling that needs no prepared statements.
			res, err := newProvider(t, openDB(t, "pgx", dsn+"&default_query_exec_mode=exec")).Up(ctx)
			if mode == pgtest.PoolSession {
				if err != nil || len(res) != 3 {
					t.Fatalf("Up through a session pooler: %d applied, %v", len(res), err)
				}
				return
			}
			if !errors.Is(err, advisory.ErrTransactionPooling) {
				t.Fatalf("Up through transaction pooling = %v, want ErrTransactionPooling", err)
			}
			t.Logf("refused: %v", err)
			var table *string
			if err := pdb.Conn(t).QueryRow(ctx, "select to_regclass('applied')::text").Scan(&table); err != nil || table != nil {
				t.Fatalf("a migration ran after the refusal (table %v, %v)", table, err)
			}
			// goose created its version table before it asked for the
			// lock (the package doc says so).
			if err := pdb.Conn(t).QueryRow(ctx, "select to_regclass('goose_db_version')::text").Scan(&table); err != nil || table == nil {
				t.Fatalf("goose's version table after the refusal: %v, %v; the doc says goose creates it first", table, err)
			}
		})
	}
}

// TestNeedsPgxDriver: with lib/pq the Locker refuses, with an error that
// names gooselock and the fix, and goose applies nothing.
func TestNeedsPgxDriver(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := newProvider(t, openDB(t, "postgres", pdb.DSN)).Up(ctx)
	if err == nil {
		t.Fatal("Up with lib/pq succeeded")
	}
	t.Logf("lib/pq: %v", err)
	for _, want := range []string{"gooselock: ", `import _ "github.com/jackc/pgx/v5/stdlib"`, `sql.Open("pgx"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Up with lib/pq: the error does not say %s", want)
		}
	}
	var table *string
	if err := pdb.Conn(t).QueryRow(ctx, "select to_regclass('applied')::text").Scan(&table); err != nil || table != nil {
		t.Fatalf("a migration ran after the refusal (table %v, %v)", table, err)
	}
}

// TestBadInput: a zero key is refused by New; a nil or zero Locker and a
// nil conn or ctx give errors, not panics.
func TestBadInput(t *testing.T) {
	t.Parallel()
	if _, err := gooselock.New(pglocks.Key{}); err == nil {
		t.Error("New(zero Key) accepted")
	}
	if _, err := gooselock.New(pglocks.KeyOf("")); err == nil {
		t.Error(`New(KeyOf("")) accepted`)
	}
	ctx := context.Background()
	var nilLocker *gooselock.Locker
	if err := nilLocker.SessionLock(ctx, nil); err == nil {
		t.Error("nil Locker's SessionLock accepted")
	}
	if err := (&gooselock.Locker{}).SessionUnlock(ctx, nil); err == nil {
		t.Error("zero Locker's SessionUnlock accepted")
	}
	l, err := gooselock.New(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SessionLock(ctx, nil); err == nil {
		t.Error("SessionLock(nil conn) accepted")
	}
	var nilCtx context.Context
	if err := l.SessionUnlock(nilCtx, nil); err == nil {
		t.Error("SessionUnlock(nil ctx) accepted")
	}
	if l.Key() != key || nilLocker.Key() != (pglocks.Key{}) {
		t.Error("Key")
	}
}
