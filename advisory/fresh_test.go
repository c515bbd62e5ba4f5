package advisory_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// TestTryLockAfterRestartDialsAtOnce: a TryLock made RedialAfter (25 ms)
// after the server accepts connections again dials at once and takes the
// lock, rather than returning the error of a dial that failed during the
// outage ("connection refused", 57P03 "the database system is starting
// up"). Before, the Locker returned its last dial error to every try until
// its backoff allowed the next dial, for up to a second after the server
// was back. Three restarts, each with tries failing throughout the outage.
func TestTryLockAfterRestartDialsAtOnce(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t)
	db := srv.NewDB(t)
	ctx := ctxT(t)
	l := newLocker(t, db.NewPool(t), advisory.Config{})
	key := pglocks.KeyOf("fresh-after-restart")
	for round := range 3 {
		lk, err := l.TryLock(ctx, key)
		if err != nil {
			t.Fatalf("round %d: TryLock before the restart: %v", round, err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var failed atomic.Int64
		var lastErr atomic.Value
		var lastOK atomic.Bool // the loop's last try took the lock: the round proves less
		var wg sync.WaitGroup
		wg.Go(func() {
			tick := time.NewTicker(5 * time.Millisecond) // pacing the load, not synchronizing
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				lk, err := l.TryLock(ctx, key)
				lastOK.Store(err == nil)
				if err != nil {
					failed.Add(1)
					lastErr.Store(err.Error())
					continue
				}
				_ = lk.Unlock(ctx) // may fail: the server may be going down
			}
		})
		if err := srv.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		close(stop)
		wg.Wait()
		back := time.Now()
		<-time.After(advisory.RedialAfter) // the rule: a call made RedialAfter after the last failed dial ended
		lk, err = l.TryLock(ctx, key)
		t.Logf("round %d: %d tries failed during the outage (last: %v; the last try of all took the lock: %v); the try after it: %v after the server was back: %v",
			round, failed.Load(), lastErr.Load(), lastOK.Load(), time.Since(back).Round(time.Microsecond), err)
		if err != nil {
			t.Fatalf("round %d: TryLock made after the server accepts connections again: %v", round, err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// gate is a TCP server that accepts connections and closes them, at once
// or, while held, only when released: a database that is down, and a dial
// that takes as long as a test wants.
type gate struct {
	ln       net.Listener
	accepted atomic.Int64
	mu       sync.Mutex
	release  chan struct{} // nil: close at once
}

func newGate(t testing.TB) *gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{ln: ln}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			g.mu.Lock()
			rel := g.release
			g.mu.Unlock()
			g.accepted.Add(1)
			if rel == nil {
				_ = c.Close()
				continue
			}
			wg.Go(func() { <-rel; _ = c.Close() })
		}
	})
	t.Cleanup(func() { _ = ln.Close(); g.open(); wg.Wait() })
	return g
}

// hold makes the gate keep the connections it accepts from now on until
// open is called.
func (g *gate) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.release == nil {
		g.release = make(chan struct{})
	}
}

// open closes every held connection, and the next ones at once.
func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.release != nil {
		close(g.release)
		g.release = nil
	}
}

// TestSharedDialErrorSaysItIsEarlier: a TryLock that arrives while another
// call's dial is under way shares that dial instead of starting another
// (no dial storm), and when the shared dial fails, its error says that the
// dial started before this call; the error of the call that started the
// dial does not.
func TestSharedDialErrorSaysItIsEarlier(t *testing.T) {
	t.Parallel()
	g := newGate(t)
	var dials atomic.Int64
	l := newLocker(t, lazyPool(t, "postgres://postgres@"+g.ln.Addr().String()+"/x?sslmode=disable&connect_timeout=30", func(c *pgxpool.Config) {
		c.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
			dials.Add(1) // once per connection attempt (pgconn may open two TCP connections for one)
			return nil
		}
	}), advisory.Config{})
	ctx := ctxT(t)
	key := pglocks.KeyOf("shared-dial")
	if _, err := l.TryLock(ctx, key); err == nil {
		t.Fatal("TryLock on a server that closes every connection succeeded")
	}
	<-time.After(advisory.RedialAfter) // the rule: the next call, made RedialAfter after the failed dial ended, dials
	// The listener dials too, once a session is open: none is, so only
	// session dials reach the gate.
	g.hold()
	before, dialed := g.accepted.Load(), dials.Load()
	first := make(chan error, 1)
	go func() { _, err := l.TryLock(ctx, key); first <- err }()
	waitFor(t, "the first call's dial", 10*time.Second, func() bool { return g.accepted.Load() > before })
	second := make(chan error, 1)
	go func() { _, err := l.TryLock(ctx, pglocks.KeyOf("shared-dial-2")); second <- err }()
	// The second call waits for the first call's dial: nothing returns
	// and no other connection comes while the gate holds it.
	select {
	case err := <-second:
		t.Fatalf("the second TryLock returned while the first call's dial was under way: %v", err)
	case <-time.After(200 * time.Millisecond): // proving an absence: nothing may happen in this window
	}
	g.open()
	err1, err2 := <-first, <-second
	t.Logf("first: %v\nsecond: %v", err1, err2)
	if n := dials.Load() - dialed; n != 1 {
		t.Errorf("%d connections for two concurrent tries, want 1 (one shared dial)", n)
	}
	if err1 == nil || err2 == nil {
		t.Fatalf("want both tries to fail: %v; %v", err1, err2)
	}
	if strings.Contains(err1.Error(), "before this call") {
		t.Errorf("the first call's own dial is marked as earlier: %v", err1)
	}
	if !strings.Contains(err2.Error(), "before this call") {
		t.Errorf("the second call's error does not say it is from an earlier dial: %v", err2)
	}
	if errors.Is(err2, advisory.ErrLocked) {
		t.Errorf("a dial error is reported as ErrLocked: %v", err2)
	}
}

// TestTryLockAfterRefusalEndsDialsAtOnce: the deterministic form of
// TestTryLockAfterRestartDialsAtOnce. The database refuses connections
// (datallowconn off: 55000 "not currently accepting connections") while
// tries fail for a second, then accepts them again; the next TryLock, made
// RedialAfter later, dials at once and takes the lock, where it used to
// return the refusal of the last dial until the Locker's backoff (up to
// 1 s by then) passed.
func TestTryLockAfterRefusalEndsDialsAtOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	admin := connTo(t, db, "postgres")
	ctx := ctxT(t)
	ident := pgx.Identifier{db.Name}.Sanitize()
	l := newLocker(t, db.NewPool(t), advisory.Config{ApplicationName: "fresh-" + db.Name})
	key := pglocks.KeyOf("fresh-after-refusal")
	lk, err := l.TryLock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "alter database "+ident+" allow_connections false"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "alter database "+ident+" allow_connections true") })
	if _, err := admin.Exec(ctx, "select pg_terminate_backend(pid) from pg_stat_activity where application_name = $1", "fresh-"+db.Name); err != nil {
		t.Fatal(err)
	}
	var failed int
	var last error
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		if _, err := l.TryLock(ctx, key); err != nil {
			failed, last = failed+1, err
		}
		<-time.After(5 * time.Millisecond) // pacing the tries, not synchronizing
	}
	if last == nil || !strings.Contains(last.Error(), "55000") {
		t.Fatalf("tries while the database refuses connections: %d failed, last %v; want 55000", failed, last)
	}
	if _, err := admin.Exec(ctx, "alter database "+ident+" allow_connections true"); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	<-time.After(advisory.RedialAfter) // the rule: a call made RedialAfter after the last failed dial ended
	lk, err = l.TryLock(ctx, key)
	t.Logf("%d tries failed while refused; the try after: %v after the database was back: %v", failed, time.Since(back).Round(time.Microsecond), err)
	if err != nil {
		t.Fatalf("TryLock made after the database accepts connections again: %v", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// connTo opens a connection to database name on db's server, closed at
// cleanup.
func connTo(t testing.TB, db *pgtest.DB, name string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Database = name
	conn, err := pgx.ConnectConfig(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}
