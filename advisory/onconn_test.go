package advisory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// holdsKey reports whether the backend pid holds key (granted), read on q.
func holdsKey(t testing.TB, ctx context.Context, q *pgx.Conn, key pglocks.Key, pid uint32) bool {
	t.Helper()
	hs, err := advisory.Holders(ctx, q, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if h.PID == pid && h.Granted {
			return true
		}
	}
	return false
}

// TestSessionLockOnConn: session locks on connections the caller owns
// exclude each other and a Locker's; a wait cut short by ctx leaves the
// connection open and holding nothing; a waiter takes the lock soon after
// its release; an unlock of a lock not held says ErrNotHeld.
func TestSessionLockOnConn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	c1, c2 := b.db.Conn(t), b.db.Conn(t)
	key := pglocks.KeyOf("onconn")
	if err := advisory.SessionLock(ctx, c1, key); err != nil {
		t.Fatal(err)
	}
	if err := advisory.TrySessionLock(ctx, c2, key); !errors.Is(err, advisory.ErrLocked) {
		t.Fatalf("TrySessionLock while c1 holds = %v, want ErrLocked", err)
	}
	if _, err := b.locker.TryLock(ctx, key); !errors.Is(err, advisory.ErrLocked) {
		t.Fatalf("Locker.TryLock while c1 holds = %v, want ErrLocked", err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := advisory.SessionLock(short, c2, key)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("SessionLock cut short = %v, want DeadlineExceeded", err)
	}
	if holdsKey(t, ctx, c1, key, c2.PgConn().PID()) {
		t.Fatal("after a cut-short wait: holding")
	}
	if c2.IsClosed() {
		// ctx ended while a try was in flight (a loaded machine), not
		// between tries: that statement may have taken the lock, so
		// SessionLock closed conn, as documented.
		t.Log("ctx ended during a try: conn closed")
		c2 = b.db.Conn(t)
	}
	got := make(chan time.Time, 1)
	go func() {
		if err := advisory.SessionLock(ctx, c2, key); err != nil {
			t.Error(err)
		}
		got <- time.Now()
	}()
	released := time.Now()
	if err := advisory.SessionUnlock(ctx, c1, key); err != nil {
		t.Fatal(err)
	}
	t.Logf("waiter took the lock %v after its release", (<-got).Sub(released).Round(time.Millisecond))
	if err := advisory.SessionUnlock(ctx, c1, key); !errors.Is(err, advisory.ErrNotHeld) {
		t.Fatalf("second SessionUnlock = %v, want ErrNotHeld", err)
	}
	if err := advisory.SessionUnlock(ctx, c2, key); err != nil {
		t.Fatal(err)
	}
	pair := pglocks.PairKey(7, 8)
	if err := advisory.TrySessionLock(ctx, c1, pair); err != nil {
		t.Fatalf("pair key: %v", err)
	}
	if err := advisory.TrySessionLock(ctx, c2, pair); !errors.Is(err, advisory.ErrLocked) {
		t.Fatalf("pair key held by c1: %v", err)
	}
	if err := advisory.SessionUnlock(ctx, c1, pair); err != nil {
		t.Fatal(err)
	}
}

// TestSessionLockOnConnRefusedBehindPooler: behind PgBouncer in
// transaction mode (most recently used first, and in turn with two server
// sessions) or statement mode, SessionLock fails with
// ErrTransactionPooling and takes nothing; in session mode it works.
func TestSessionLockOnConnRefusedBehindPooler(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		mode pgtest.PoolMode
		opts []pgtest.BouncerOption
	}{
		"Transaction":           {pgtest.PoolTransaction, nil},
		"TransactionRoundRobin": {pgtest.PoolTransaction, []pgtest.BouncerOption{pgtest.BouncerRoundRobin(), pgtest.BouncerPoolSize(2)}},
		"Statement":             {pgtest.PoolStatement, nil},
		"Session":               {pgtest.PoolSession, nil},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			_, dsn := db.Bouncer(t, tc.mode, tc.opts...)
			ctx := ctxT(t)
			conn, err := pgx.Connect(ctx, dsn+"&default_query_exec_mode=exec")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			key := pglocks.KeyOf("onconn-pooled")
			err = advisory.SessionLock(ctx, conn, key)
			if tc.mode == pgtest.PoolSession {
				if err != nil {
					t.Fatalf("SessionLock through a session pooler: %v", err)
				}
				if err := advisory.SessionUnlock(ctx, conn, key); err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, advisory.ErrTransactionPooling) {
				t.Fatalf("SessionLock through %s pooling = %v, want ErrTransactionPooling", tc.mode, err)
			}
			if held, err := advisory.IsHeld(ctx, db.Conn(t), key); err != nil || held {
				t.Fatalf("IsHeld after refusal = %v, %v", held, err)
			}
		})
	}
}

// TestSessionLockOnConnLostReply: a try that takes the lock on the server
// but whose reply never comes is an unknown outcome: when ctx ends,
// TrySessionLock returns an error, the connection is closed, and the
// server frees the lock with the session — nothing is held for nobody.
// The proxy delays every message by 1 s, so the reply is still in the
// proxy when the server shows the lock taken; then it drops it.
func TestSessionLockOnConnLostReply(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	p, dsn := db.Proxy(t)
	ctx := ctxT(t)
	watcher := db.Conn(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	var pid uint32
	if err := conn.QueryRow(ctx, "select pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	key := pglocks.KeyOf("onconn-lost-reply")
	p.SetLatency(time.Second)
	defer p.Pass()
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- advisory.TrySessionLock(lctx, conn, key) }()
	waitFor(t, "the try to take the lock on the server", time.Minute, func() bool { return holdsKey(t, ctx, watcher, key, pid) })
	p.DropReplies()
	select {
	case err := <-done:
		t.Fatalf("TrySessionLock returned %v before its reply was dropped (a stall of 1 s): no unknown outcome to test", err)
	default:
	}
	cancelled := time.Now()
	cancel()
	err = <-done
	t.Logf("returned %v after the cancel", time.Since(cancelled))
	if err == nil || !conn.IsClosed() {
		t.Fatalf("TrySessionLock without its reply = %v, connection closed %v; want an error and closed", err, conn.IsClosed())
	}
	t.Logf("TrySessionLock without its reply: %v", err)
	waitFor(t, "the server to free the lock", time.Minute, func() bool { return !holdsKey(t, ctx, watcher, key, pid) })
	t.Logf("freed %v after the cancel", time.Since(cancelled))
}

// TestSessionLockOnConnBadInput: nil or closed input is an error naming
// it, never a panic.
func TestSessionLockOnConnBadInput(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := ctxT(t)
	key := pglocks.KeyOf("onconn-bad")
	closed, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	_ = closed.Close(ctx)
	var nilCtx context.Context
	for name, call := range map[string]func() error{
		"NilConn":       func() error { return advisory.SessionLock(ctx, nil, key) },
		"ClosedConn":    func() error { return advisory.TrySessionLock(ctx, closed, key) },
		"ZeroKey":       func() error { return advisory.SessionLock(ctx, db.Conn(t), pglocks.Key{}) },
		"NilContext":    func() error { return advisory.SessionUnlock(nilCtx, db.Conn(t), key) },
		"UnlockNilConn": func() error { return advisory.SessionUnlock(ctx, nil, key) },
	} {
		if err := call(); err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}
