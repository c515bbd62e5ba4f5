package pglocks_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/schedule"
)

// The README's snippets, each verbatim as the body of a function; the
// functions they call stand for the user's own code.
// readme:begin

func readmeAdvisory(ctx context.Context, pool *pgxpool.Pool) error {
	locker, err := advisory.New(pool, advisory.Config{}) // pool is a *pgxpool.Pool
	if err != nil {
		return err
	}
	defer locker.Close(ctx)

	lk, err := locker.TryLock(ctx, pglocks.KeyOf("import:42"))
	if errors.Is(err, advisory.ErrLocked) {
		return nil // another replica holds it
	}
	if err != nil {
		return err
	}
	defer lk.Unlock(ctx)
	// lk.Lost() closes if the session dies (backend killed, restart, network);
	// locker.Do(ctx, key, fn) runs fn with a ctx cancelled on that loss.
	return importBatch(ctx, 42)
}

func readmeLease(ctx context.Context, pool *pgxpool.Pool) error {
	store, err := lease.New(pool, lease.Config{}) // one per process, in a service
	if err != nil {
		return err
	}
	defer store.Close(ctx)
	if err := store.Migrate(ctx); err != nil { // once; or lease.SchemaSQL with your migration tool
		return err
	}

	l, err := store.TryAcquire(ctx, "job:nightly", 30*time.Second, lease.WithKeepAlive())
	var held *lease.HeldError
	if errors.As(err, &held) {
		return nil // held.Owner runs it; it is free in held.ExpiresIn at the latest
	}
	if err != nil {
		return err
	}
	defer l.Release(context.WithoutCancel(ctx)) // ends the lease whatever happens

	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := l.Guard(ctx, tx); err != nil { // commits only while really held
			return err
		}
		_, err := tx.Exec(ctx, "update accounts set balance = balance - 10 where id = 1")
		return err
	})
}

func readmeLeader(ctx context.Context, pool *pgxpool.Pool) error {
	e, err := leader.New(leader.Config{Name: "scheduler", Pool: pool}) // needs the lease table: store.Migrate or pglocks migrate
	if err != nil {
		return err
	}
	defer e.Close(ctx)
	return e.Run(ctx, func(ctx context.Context, term leader.Term) error {
		return runScheduler(ctx, term) // ctx ends when leadership is lost; fence writes with term.Guard
	})
}

func readmeSchedule(ctx context.Context, pool *pgxpool.Pool, store *lease.Store) error {
	runner, err := schedule.New(schedule.Config{Store: store, Pool: pool}) // runner.Migrate(ctx) once
	if err != nil {
		return err
	}
	job, err := runner.Job("nightly-report", schedule.Policy{Period: 24 * time.Hour})
	if err != nil {
		return err
	}
	_, err = job.Do(ctx, func(ctx context.Context, run *schedule.Run) error {
		return report(ctx, run.Lease()) // guard its writes with run.Lease().Guard
	})
	var taken *schedule.TakenError
	if errors.As(err, &taken) {
		return nil // this slot ran elsewhere: taken.By says where, when and how it ended
	}
	return err
}

// readme:end

// The user's own code, as the snippets call it.
var (
	imported     = make(chan int, 1)
	runScheduler func(ctx context.Context, term leader.Term) error
)

func importBatch(_ context.Context, n int) error { imported <- n; return nil }

var reports atomic.Int32

func report(context.Context, *lease.Lease) error { reports.Add(1); return nil }

// TestReadmeSnippets: every go block of README.md is, line for line, the
// body of one of the functions above, which the other tests run.
func TestReadmeSnippets(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	code := normalize(string(src))
	blocks := strings.Split(string(readme), "```go\n")[1:]
	if len(blocks) < 3 {
		t.Fatalf("README.md has %d go blocks, want the three primitives' at least", len(blocks))
	}
	for _, b := range blocks {
		block, _, _ := strings.Cut(b, "```")
		block = strings.TrimRight(block, "\n")
		if !strings.Contains(code, normalize(block)) {
			t.Errorf("README.md's go block is not in readme_test.go (keep the two equal):\n%s", block)
		}
	}
}

// normalize drops each line's indentation.
func normalize(s string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(s, "\n") {
		b.WriteString(strings.TrimSpace(line) + "\n")
	}
	return b.String()
}

// TestReadmeAdvisory runs the advisory snippet free and busy.
func TestReadmeAdvisory(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	if err := readmeAdvisory(ctx, db.NewPool(t)); err != nil {
		t.Fatal(err)
	}
	if n := <-imported; n != 42 {
		t.Fatalf("imported %d", n)
	}
	other, err := advisory.New(db.NewPool(t), advisory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	lk, err := other.TryLock(ctx, pglocks.KeyOf("import:42"))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(ctx)
	if err := readmeAdvisory(ctx, db.NewPool(t)); err != nil {
		t.Fatalf("busy: %v", err)
	}
	select {
	case n := <-imported:
		t.Fatalf("imported %d while another replica held the lock", n)
	default:
	}
}

// TestReadmeLease runs the lease snippet free (its guarded write commits)
// and busy (it returns nil: it used to call Release on a nil Lease).
func TestReadmeLease(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	pool := db.NewPool(t)
	if _, err := pool.Exec(ctx, "create table accounts (id int primary key, balance int); insert into accounts values (1, 100)"); err != nil {
		t.Fatal(err)
	}
	if err := readmeLease(ctx, pool); err != nil {
		t.Fatal(err)
	}
	other, err := lease.New(pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	l, err := other.TryAcquire(ctx, "job:nightly", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if err := readmeLease(ctx, pool); err != nil {
		t.Fatalf("busy: %v", err)
	}
	var balance int
	if err := pool.QueryRow(ctx, "select balance from accounts where id = 1").Scan(&balance); err != nil || balance != 90 {
		t.Fatalf("balance %d (%v), want 90: one guarded write, none while busy", balance, err)
	}
}

// TestReadmeLeader runs the leader snippet until it has led once.
func TestReadmeLeader(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pool := db.NewPool(t)
	if _, err := pool.Exec(t.Context(), "create table accounts (id int primary key, balance int); insert into accounts values (1, 100)"); err != nil {
		t.Fatal(err)
	}
	if err := readmeLease(t.Context(), pool); err != nil { // migrates
		t.Fatal(err)
	}
	ctx, stop := context.WithTimeout(t.Context(), time.Minute)
	defer stop()
	led := make(chan int64, 1)
	runScheduler = func(_ context.Context, term leader.Term) error {
		led <- term.Number
		stop()
		return nil
	}
	if err := readmeLeader(ctx, pool); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-led:
		t.Logf("led in term %d", n)
	default:
		t.Fatal("never led")
	}
}

// TestReadmeSchedule runs the schedule snippet from three replicas: the
// slot runs once, the others take the busy path.
func TestReadmeSchedule(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	for i := range 3 {
		pool := db.NewPool(t)
		store, err := lease.New(pool, lease.Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close(ctx)
		if i == 0 {
			runner, err := schedule.New(schedule.Config{Store: store, Pool: pool})
			if err != nil {
				t.Fatal(err)
			}
			if err := runner.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := readmeSchedule(ctx, pool, store); err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
	}
	if n := reports.Load(); n != 1 {
		t.Fatalf("the nightly report ran %d times, want once", n)
	}
}

// TestReadmeShort: README.md stays readable in ten minutes (at most 1,500
// words, as wc -w counts them); details belong in docs/ and package docs.
func TestReadmeShort(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(strings.Fields(string(readme))); n > 1500 {
		t.Errorf("README.md has %d words, want at most 1,500: move details to docs/", n)
	}
}
