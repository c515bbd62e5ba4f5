package pooler_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/internal/logtest"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

func migrate(t *testing.T, db *pgtest.DB) {
	t.Helper()
	s, err := lease.New(db.NewPool(t), lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if err := s.Migrate(ctxFor(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// advisoryLocks counts the advisory locks held or awaited in db's database.
func advisoryLocks(t *testing.T, direct *pgx.Conn) int {
	t.Helper()
	var n int
	if err := direct.QueryRow(ctxFor(t, 30*time.Second), `select count(*) from pg_locks where locktype = 'advisory'
		and database = (select oid from pg_database where datname = current_database())`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitServer waits until cond, a query on direct returning a bool, is true.
func waitServer(t *testing.T, direct *pgx.Conn, what, cond string) {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	for {
		var ok bool
		if err := direct.QueryRow(ctx, cond).Scan(&ok); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the server never showed %s", what)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// checkLocker: where sessions are kept a session lock is held on one
// backend and excludes another client's transaction lock; elsewhere TryLock
// fails with ErrTransactionPooling and nothing is held on the server.
func checkLocker(t *testing.T, db *pgtest.DB, dsn string, keeps bool) {
	ctx := ctxFor(t, time.Minute)
	l, err := advisory.New(pgtest.NewPool(t, dsn), advisory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	direct := db.Conn(t)
	key := pglocks.KeyOf("matrix:" + t.Name())
	lk, err := l.TryLock(ctx, key)
	if !keeps {
		if !errors.Is(err, advisory.ErrTransactionPooling) {
			t.Fatalf("Locker.TryLock: %v, want ErrTransactionPooling", err)
		}
		if n := advisoryLocks(t, direct); n != 0 {
			t.Fatalf("%d advisory locks on the server after a refused TryLock", n)
		}
		return
	}
	if err != nil {
		t.Fatalf("Locker.TryLock: %v", err)
	}
	hs, err := advisory.Holders(ctx, direct, key)
	if err != nil || len(hs) != 1 || !hs[0].Granted || hs[0].PID != lk.PID() {
		t.Fatalf("holders of a held lock: %+v, %v; want backend %d alone", hs, err, lk.PID())
	}
	err = pgx.BeginFunc(ctx, direct, func(tx pgx.Tx) error {
		err := advisory.TryXactLock(ctx, tx, key)
		switch {
		case err == nil:
			return errors.New("another client's TryXactLock succeeded while the Locker holds the key")
		case errors.Is(err, advisory.ErrLocked):
			return nil
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := advisoryLocks(t, direct); n != 0 {
		t.Fatalf("%d advisory locks on the server after Unlock", n)
	}
}

// checkListener: an Acquire that waits for a held lease LISTENs and takes
// its interest lock on the server where sessions are kept, and logs that it
// polls elsewhere; either way the release hands the lease over.
func checkListener(t *testing.T, db *pgtest.DB, dsn string, keeps bool) {
	ctx := ctxFor(t, time.Minute)
	rec, logger := logtest.New()
	pool := pgtest.NewPool(t, dsn)
	var stores [2]*lease.Store
	for i := range stores {
		s, err := lease.New(pool, lease.Config{Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(context.Background())
		stores[i] = s
	}
	name := "matrix:" + t.Name()
	holder, err := stores[0].TryAcquire(ctx, name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := stores[1].Acquire(ctx, name, time.Hour)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	if keeps {
		waitServer(t, db.Conn(t), "the waiter's interest lock", `select exists (select from pg_locks where locktype = 'advisory'
			and database = (select oid from pg_database where datname = current_database()))`)
	} else if _, ok := rec.Wait(slog.LevelWarn, "waiting Acquires poll", time.Minute); !ok {
		t.Fatalf("the store never said it polls; log: %v", rec.Records())
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiting Acquire: %v", err)
	}
}

// checkElector: an elector in ModeAuto campaigns in session mode where
// sessions are kept (its gate lock on the server) and on the lease alone
// elsewhere; Observe LISTENs on the server, or logs that it polls.
func checkElector(t *testing.T, db *pgtest.DB, dsn string, keeps bool) {
	ctx := ctxFor(t, 2*time.Minute)
	rec, logger := logtest.New()
	name := pglocks.KeyOf(t.Name()).String()
	e, err := leader.New(leader.Config{Name: "matrix-" + name, Pool: pgtest.NewPool(t, dsn), Logger: logger, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	elected, done := make(chan leader.Term, 1), make(chan error, 1)
	go func() {
		done <- e.Run(runCtx, func(ctx context.Context, term leader.Term) error {
			elected <- term
			<-ctx.Done()
			return nil
		})
	}()
	select {
	case <-elected:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-ctx.Done():
		t.Fatal("never elected")
	}
	// Observe starts now, just before the server is asked: its LISTEN
	// shows in pg_stat_activity only until its first heartbeat (after
	// dial.ListenIdleTimeout/2), and an election on a loaded machine can
	// take longer than that.
	obs := e.Observe(runCtx)
	if st, want := e.State(), map[bool]leader.Mode{true: leader.ModeSession, false: leader.ModeLeaseOnly}[keeps]; st.Mode != want {
		t.Fatalf("elector campaigns in %v, want %v", st.Mode, want)
	}
	if keeps { // Observe's own LISTEN, not the Locker's on its channel
		waitServer(t, db.Conn(t), "Observe's LISTEN", `select exists (select from pg_stat_activity
			where datname = current_database() and query = 'listen "`+leader.DefaultChannel+`"' and state = 'idle')`)
		if _, ok := rec.Wait(slog.LevelWarn, "observe: the pool is behind a pooler", 0); ok {
			t.Fatal("Observe polls where sessions are kept")
		}
	} else if _, ok := rec.Wait(slog.LevelWarn, "observe: the pool is behind a pooler", time.Minute); !ok {
		t.Fatalf("Observe never said it polls; log: %v", rec.Records())
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	for range obs {
	}
}
