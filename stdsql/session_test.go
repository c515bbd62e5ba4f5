package stdsql_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/stdsql"
)

func conn(t *testing.T, ctx context.Context, db *sql.DB) *sql.Conn {
	t.Helper()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestSessionLock: session locks on *sql.Conns of pgx's stdlib driver
// exclude each other; a waiter takes the lock once it is released; an
// unlock of a lock not held says ErrNotHeld.
func TestSessionLock(t *testing.T) {
	t.Parallel()
	db := open(t, "pgx", pgtest.New(t).DSN)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c1, c2 := conn(t, ctx, db), conn(t, ctx, db)
	key := pglocks.KeyOf("stdsql-session")
	if err := stdsql.SessionLock(ctx, c1, key); err != nil {
		t.Fatal(err)
	}
	if err := stdsql.TrySessionLock(ctx, c2, key); !errors.Is(err, advisory.ErrLocked) {
		t.Fatalf("TrySessionLock while c1 holds = %v, want ErrLocked", err)
	}
	got := make(chan error, 1)
	go func() { got <- stdsql.SessionLock(ctx, c2, key) }()
	if err := stdsql.SessionUnlock(ctx, c1, key); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("SessionLock after the release: %v", err)
	}
	if err := stdsql.SessionUnlock(ctx, c1, key); !errors.Is(err, advisory.ErrNotHeld) {
		t.Fatalf("SessionUnlock of c1, which no longer holds = %v, want ErrNotHeld", err)
	}
	if err := stdsql.SessionUnlock(ctx, c2, key); err != nil {
		t.Fatal(err)
	}
}

// TestSessionLockNeedsPgxDriver: with lib/pq the session cannot be checked
// for a pooler, so SessionLock refuses, naming the driver, and takes
// nothing; a closed or nil *sql.Conn is an error too.
func TestSessionLockNeedsPgxDriver(t *testing.T) {
	t.Parallel()
	pdb := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := pglocks.KeyOf("stdsql-pq")
	err := stdsql.SessionLock(ctx, conn(t, ctx, open(t, "postgres", pdb.DSN)), key)
	if err == nil || !strings.Contains(err.Error(), "pgx's stdlib driver") {
		t.Fatalf("SessionLock with lib/pq = %v, want a refusal naming pgx's stdlib driver", err)
	}
	t.Logf("lib/pq: %v", err)
	if held, err := advisory.IsHeld(ctx, pdb.Conn(t), key); err != nil || held {
		t.Fatalf("IsHeld after the refusal = %v, %v", held, err)
	}
	closed := conn(t, ctx, open(t, "pgx", pdb.DSN))
	_ = closed.Close()
	if err := stdsql.SessionLock(ctx, closed, key); !errors.Is(err, sql.ErrConnDone) {
		t.Errorf("SessionLock on a closed *sql.Conn = %v, want sql.ErrConnDone", err)
	}
	if err := stdsql.SessionUnlock(ctx, nil, key); err == nil {
		t.Error("SessionUnlock(nil conn) accepted")
	}
}
