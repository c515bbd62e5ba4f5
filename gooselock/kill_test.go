package gooselock_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/gooselock"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pressly/goose/v3"
)

// childDSN, set in a child's environment, makes the test binary a replica
// whose migration 2 never ends (see child).
const childDSN = "GOOSELOCK_CHILD_DSN"

// killProvider migrates 1 and 3 from SQL and 2 in Go, by v2, in the
// transaction goose opens on the connection it locked.
func killProvider(db *sql.DB, v2 func(context.Context, *sql.Tx) error) (*goose.Provider, error) {
	locker, err := gooselock.New(key)
	if err != nil {
		return nil, err
	}
	fs := fstest.MapFS{"00001_applied.sql": migrations["00001_applied.sql"], "00003_widgets.sql": migrations["00003_widgets.sql"]}
	return goose.NewProvider(goose.DialectPostgres, db, fs, goose.WithSessionLocker(locker),
		goose.WithGoMigrations(goose.NewGoMigration(2, &goose.GoFunc{RunTx: v2}, nil)))
}

// child is a replica killed in the middle of migration 2: it prints
// MIGRATING and its backend's pid from inside the migration and waits.
func child(dsn string) int {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	p, err := killProvider(db, func(ctx context.Context, tx *sql.Tx) error {
		var pid int
		if err := tx.QueryRowContext(ctx, "select pg_backend_pid()").Scan(&pid); err != nil {
			return err
		}
		fmt.Println("MIGRATING", pid)
		<-ctx.Done() // until killed
		return ctx.Err()
	})
	if err == nil {
		_, err = p.Up(context.Background())
	}
	fmt.Println("ERROR", err)
	return 1
}

// TestKilledReplicaFreesLock: a replica SIGKILLed while it holds the lock
// in the middle of a migration frees it with its session; a replica
// waiting meanwhile then migrates, and the killed replica's half-done
// migration (rolled back with its session) is applied once.
func TestKilledReplicaFreesLock(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pid, kill := startChild(t, pdb.DSN)
	watch := pdb.Conn(t)
	hs, err := advisory.Holders(ctx, watch, key)
	if err != nil || len(hs) != 1 || hs[0].PID != pid || !hs[0].Granted {
		t.Fatalf("holders of the key while the child migrates: %+v, %v; want its backend %d", hs, err, pid)
	}

	db := openDB(t, "pgx", pdb.DSN+"&application_name=gooselock-waiter")
	p, err := killProvider(db, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "insert into applied (version) values (2)")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	type up struct {
		res []*goose.MigrationResult
		err error
	}
	done := make(chan up, 1)
	go func() {
		res, err := p.Up(ctx)
		done <- up{res, err}
	}()
	waitFor(t, "the waiting replica's tries", func() bool {
		var n int
		err := watch.QueryRow(ctx, `select count(*) from pg_stat_activity
			where application_name = 'gooselock-waiter' and query = 'select pg_catalog.pg_try_advisory_lock($1::int8)'`).Scan(&n)
		return err == nil && n > 0
	})
	killed := time.Now()
	kill()
	r := <-done
	t.Logf("the waiting replica migrated %v after the SIGKILL", time.Since(killed).Round(time.Millisecond))
	if r.err != nil {
		t.Fatal(r.err)
	}
	var applied []int64
	for _, m := range r.res {
		applied = append(applied, m.Source.Version)
	}
	if !slices.Equal(applied, []int64{2, 3}) {
		t.Errorf("the waiting replica applied %v, want [2 3] (1 was the killed one's)", applied)
	}
	if got := appliedVersions(t, ctx, db); !slices.Equal(got, []int{1, 2, 3}) {
		t.Errorf("rows written by the migrations = %v, want [1 2 3]", got)
	}
}

// startChild starts a child replica on dsn and returns the pid of its
// backend once it migrates, and a func that SIGKILLs the child and reaps
// it (also run at cleanup).
func startChild(t *testing.T, dsn string) (uint32, func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childDSN+"="+dsn)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	kill := func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	t.Cleanup(kill)
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	deadline := time.After(time.Minute)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatal("the child exited before it migrated")
			}
			if pid, found := strings.CutPrefix(line, "MIGRATING "); found {
				n, err := strconv.ParseUint(pid, 10, 32)
				if err != nil {
					t.Fatal(err)
				}
				go func() { // drain
					for range lines {
					}
				}()
				return uint32(n), kill
			}
			if strings.HasPrefix(line, "ERROR") {
				t.Fatalf("child: %s", line)
			}
		case <-deadline:
			t.Fatal("the child did not start migrating within a minute")
		}
	}
}

// waitFor polls cond until it holds, for up to a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	delay := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		timer := time.NewTimer(delay)
		<-timer.C
		delay = min(2*delay, 50*time.Millisecond)
	}
}
