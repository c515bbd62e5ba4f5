package advisory

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/pgtest"
)

// A try that the server answered with an error, after it took the lock (a
// session lock survives its statement's failure), is settled from
// pg_locks: the caller gets the lock, the session and its other locks stay.
// One that took nothing returns the error. Design weakness 6.
func TestSettleFailedTry(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pool := db.NewPool(t)
	l, err := New(pool, Config{MaxSessions: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer func() {
		if err := l.Close(ctx); err != nil {
			t.Error(err)
		}
	}()
	innocent, err := l.TryLock(ctx, pglocks.KeyOf("settle-innocent"))
	if err != nil {
		t.Fatal(err)
	}
	s := innocent.sess
	failure := &pgconn.PgError{Severity: "ERROR", Code: "57014", Message: "canceling statement due to user request"}
	settleTry := func(key pglocks.Key, takeFirst bool) *request {
		t.Helper()
		if err := l.reserve(ctx, idOf(key), false, false); err != nil {
			t.Fatal(err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if takeFirst { // what the failed statement did before it failed
			if _, err := s.conn.Exec(ctx, "select pg_advisory_lock("+key.SQL()+")").ReadAll(); err != nil {
				t.Fatal(err)
			}
		}
		r := newRequest(opTry, key, false)
		s.pending.Add(1)
		if err := s.complete(r, &reply{pgErr: failure}, nil); err != nil {
			t.Fatalf("complete: %v", err)
		}
		return r
	}

	took := settleTry(pglocks.KeyOf("settle-took"), true)
	if took.err != nil || took.got == nil {
		t.Fatalf("a failed try that took the lock: got %v, err %v; want the lock", took.got, took.err)
	}
	if held, err := IsHeld(ctx, pool, pglocks.KeyOf("settle-took")); err != nil || !held {
		t.Fatalf("IsHeld = %v, %v", held, err)
	}
	if err := took.got.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if held, err := IsHeld(ctx, pool, pglocks.KeyOf("settle-took")); err != nil || held {
		t.Fatalf("IsHeld after Unlock = %v, %v", held, err)
	}

	nothing := settleTry(pglocks.KeyOf("settle-nothing"), false)
	if nothing.got != nil || !errors.As(nothing.err, new(*pgconn.PgError)) {
		t.Fatalf("a failed try that took nothing: got %v, err %v; want the server's error", nothing.got, nothing.err)
	}
	if err := innocent.Err(); err != nil {
		t.Fatalf("the session's other lock was lost: %v", err)
	}
	if err := innocent.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
