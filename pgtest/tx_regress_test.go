package pgtest_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks/pgtest"
)

// recordingTB records a test's errors and cleanups instead of failing it,
// so that a test can check what NewTx reports.
type recordingTB struct {
	testing.TB
	errs     []string
	cleanups []func()
}

func (r *recordingTB) Error(args ...any) { r.errs = append(r.errs, fmt.Sprint(args...)) }
func (r *recordingTB) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recordingTB) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

func (r *recordingTB) end() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// A test that commits inside NewTx's transaction fails, and no later NewTx
// test sees what it committed.
func TestNewTxRegressCommitDetected(t *testing.T) {
	srv := pgtest.NewServer(t)
	tbl := "leak_" + pgtest.RandomToken()
	r := &recordingTB{TB: t}
	tx := srv.NewTx(r)
	if _, err := tx.Exec(ctxT(t, 30*time.Second), "commit; create table "+tbl+" (x int)"); err != nil {
		t.Fatal(err)
	}
	r.end()
	if len(r.errs) != 1 || !strings.Contains(r.errs[0], "ended its transaction") {
		t.Errorf("errors reported: %q, want one saying the test ended its transaction", r.errs)
	}
	next := srv.NewTx(t)
	var n int
	if err := next.QueryRow(ctxT(t, 30*time.Second), "select count(*) from pg_tables where tablename = $1", tbl).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("an earlier NewTx test's committed table %s is visible", tbl)
	}
}

// A test that calls the transaction's Rollback itself is not told it
// committed.
func TestNewTxRegressOwnRollback(t *testing.T) {
	srv := pgtest.NewServer(t)
	r := &recordingTB{TB: t}
	tx := srv.NewTx(r)
	if err := tx.Rollback(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	r.end()
	if len(r.errs) != 0 {
		t.Errorf("errors reported for a rollback: %q", r.errs)
	}
}

// PREPARE is session state: NewTx's cleanup discards it.
func TestNewTxRegressPrepareReset(t *testing.T) {
	srv := pgtest.NewServer(t)
	for i := range 4 {
		t.Run("p", func(t *testing.T) {
			tx := srv.NewTx(t)
			if _, err := tx.Exec(ctxT(t, 30*time.Second), "prepare regress_p as select 1"); err != nil {
				t.Fatalf("test %d: %v", i, err)
			}
			var one int
			if err := tx.QueryRow(ctxT(t, 30*time.Second), "select $1::int", 1).Scan(&one); err != nil {
				t.Fatalf("test %d: %v", i, err)
			}
		})
	}
}

// A test that sends ROLLBACK as a statement is not told it committed.
func TestNewTxRegressRollbackStatement(t *testing.T) {
	srv := pgtest.NewServer(t)
	r := &recordingTB{TB: t}
	tx := srv.NewTx(r)
	if _, err := tx.Exec(ctxT(t, 30*time.Second), "rollback"); err != nil {
		t.Fatal(err)
	}
	r.end()
	if len(r.errs) != 0 {
		t.Errorf("errors reported for a ROLLBACK statement: %q", r.errs)
	}
}

// A test that commits and begins again fails, though its session is in a
// transaction at cleanup, and no later NewTx test sees what it committed.
func TestNewTxRegressCommitBegin(t *testing.T) {
	srv := pgtest.NewServer(t)
	tbl := "leak_" + pgtest.RandomToken()
	r := &recordingTB{TB: t}
	tx := srv.NewTx(r)
	if _, err := tx.Exec(ctxT(t, 30*time.Second), "create table "+tbl+" (x int); commit; begin"); err != nil {
		t.Fatal(err)
	}
	r.end()
	if len(r.errs) != 1 || !strings.Contains(r.errs[0], "ended its transaction") {
		t.Errorf("errors reported: %q, want one saying the test ended its transaction", r.errs)
	}
	next := srv.NewTx(t)
	var n int
	if err := next.QueryRow(ctxT(t, 30*time.Second), "select count(*) from pg_tables where tablename = $1", tbl).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("an earlier NewTx test's committed table %s is visible", tbl)
	}
}
