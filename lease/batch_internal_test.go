package lease

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/pgtest"
)

// batchEnv is a store whose names a0, a1, … were acquired and released by
// it (so that its next tries are fast retakes), and a direct connection.
type batchEnv struct {
	s    *Store
	conn *pgx.Conn
	ctx  context.Context
}

func newBatchEnv(t *testing.T, names ...string) batchEnv {
	t.Helper()
	return newBatchEnvWith(t, nil, names...)
}

// newBatchEnvWith is newBatchEnv with a pool configured by configure.
func newBatchEnvWith(t *testing.T, configure func(*pgxpool.Config), names ...string) batchEnv {
	t.Helper()
	return newBatchEnvOn(t, pgtest.New(t), configure, names...)
}

// newBatchEnvOn is newBatchEnvWith on db, whose lease table it creates if
// missing.
func newBatchEnvOn(t *testing.T, db *pgtest.DB, configure func(*pgxpool.Config), names ...string) batchEnv {
	t.Helper()
	if configure == nil {
		configure = func(*pgxpool.Config) {}
	}
	s, err := New(db.NewPool(t, configure), Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		l, err := s.TryAcquire(ctx, n, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return batchEnv{s: s, conn: db.Conn(t), ctx: ctx}
}

// row returns name's owner (nil: none), token and attempt id.
func (e batchEnv) row(t *testing.T, name string) (owner *uuid.UUID, token int64, attempt uuid.UUID) {
	t.Helper()
	if err := e.conn.QueryRow(e.ctx, "select owner, token, attempt from pglocks_leases where name = $1", name).Scan(&owner, &token, &attempt); err != nil {
		t.Fatal(err)
	}
	return owner, token, attempt
}

// lockRow locks name's row in a transaction open until the test ends.
func (e batchEnv) lockRow(t *testing.T, dsnConn *pgx.Conn, name string) {
	t.Helper()
	tx, err := dsnConn.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(e.ctx, "select from pglocks_leases where name = $1 for update", name); err != nil {
		t.Fatal(err)
	}
}

// within runs f, failing the test if it does not return within 30 s.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not return within 30 s", what)
	}
}

// TestFastBatch: one batch of fast retakes. Two attempts of one name: one
// wins. A locked row and a held row: no row, at once. An attempt whose
// caller gave up while the batch ran (here: as its statement started):
// taken, then cleaned up by its attempt id.
func TestFastBatch(t *testing.T) {
	t.Parallel()
	giveUp := &abandonOnStart{}
	e := newBatchEnvWith(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = giveUp }, "a", "b", "c", "d")
	if _, err := e.s.TryAcquire(e.ctx, "d", time.Minute, WithOwner(uuid.New())); err != nil {
		t.Fatal(err)
	}
	locker, err := pgx.Connect(e.ctx, e.conn.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = locker.Close(context.Background()) })
	e.lockRow(t, locker, "c")
	_, tokenA, _ := e.row(t, "a")
	q := func(name string) *queuedFast {
		return &queuedFast{name: name, attempt: uuid.New(), o: options{owner: uuid.New()}, ttl: time.Minute, ticket: newTicket[shot]()}
	}
	batch := []*queuedFast{q("a"), q("a"), q("b"), q("c"), q("d")}
	giveUp.q.Store(batch[2])
	if err := e.s.enter(); err != nil {
		t.Fatal(err)
	}
	within(t, "the batch", func() { defer e.s.exit(); e.s.fastBatch(batch) })
	won := 0
	for i, b := range []*queuedFast{batch[0], batch[1], batch[3], batch[4]} {
		sh := <-b.done
		if sh.err != nil || sh.b.pid != 0 || sh.b.sent.IsZero() {
			t.Fatalf("attempt %d: %+v", i, sh)
		}
		if sh.r.acquired {
			won++
			if b.name != "a" || sh.r.token != tokenA+1 {
				t.Fatalf("%s acquired with token %d (a's was %d)", b.name, sh.r.token, tokenA)
			}
		}
	}
	if won != 1 {
		t.Fatalf("%d attempts of a won, want 1", won)
	}
	waitUntil(t, "b freed after the batch took it for the caller that gave up", func() bool {
		owner, _, attempt := e.row(t, "b")
		return owner == nil && attempt == batch[2].attempt
	})
}

// waitUntil polls cond every millisecond, failing the test after 30 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s: not within 30 s", what)
		}
	}
}

// TestReleaseBatch: one batch of releases. A lease released twice in the
// batch: released once. A guarded lease: not released, at once (its
// caller then releases it alone). A lease no longer held: not released.
func TestReleaseBatch(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, "gone")
	ctx := e.ctx
	a, err := e.s.TryAcquire(ctx, "a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	g, err := e.s.TryAcquire(ctx, "g", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := e.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if err := g.Guard(ctx, tx); err != nil {
		t.Fatal(err)
	}
	q := func(l *Lease) *queuedRelease {
		return &queuedRelease{name: l.name, owner: l.owner, token: l.token, ticket: newTicket[batchResult]()}
	}
	gone := &queuedRelease{name: "gone", owner: uuid.New(), token: 1, ticket: newTicket[batchResult]()}
	batch := []*queuedRelease{q(a), q(a), q(g), gone}
	within(t, "the batch", func() { e.s.releaseBatch(batch) })
	var got []bool
	for _, b := range batch {
		res := <-b.done
		if res.err != nil {
			t.Fatal(res.err)
		}
		got = append(got, res.released)
	}
	if got[0] == got[1] || got[2] || got[3] {
		t.Fatalf("released %v, want one of a's two, not g, not gone", got)
	}
	if owner, _, _ := e.row(t, "a"); owner != nil {
		t.Fatal("a still held")
	}
	if owner, _, _ := e.row(t, "g"); owner == nil {
		t.Fatal("g released under its guard")
	}
}

// busyLanes makes every call of e's store queue, and no batch run, until
// the test takes the batches itself: all direct slots of each kind count
// as taken, and a batch goroutine as running.
func busyLanes(e batchEnv) {
	for _, c := range []interface{ busy(int) }{&e.s.fasts, &e.s.rels} {
		c.busy(e.s.cfg.BatchAfter)
	}
}

// busy takes n direct slots of c and marks a batch goroutine running.
func (c *combiner[T]) busy(n int) {
	c.mu.Lock()
	c.direct, c.batching = n, true
	c.mu.Unlock()
}

// queued returns the length of c's queue.
func (c *combiner[T]) queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// TestBatchAfterOff: a negative Config.BatchAfter never queues a call.
func TestBatchAfterOff(t *testing.T) {
	var c combiner[int]
	for i := range 1000 {
		if direct, _ := c.join(&i, -1); !direct {
			t.Fatalf("call %d queued", i)
		}
	}
	if direct, _ := c.join(new(int), 1000); direct {
		t.Fatal("the 1001st call ran alone under a limit of 1000")
	}
}

// abandonOnStart is a pgx tracer that abandons the queued attempt q, as its
// caller would whose ctx ends, when a batch statement starts.
type abandonOnStart struct{ q atomic.Pointer[queuedFast] }

// TraceQueryStart abandons q at the start of fastManySQL.
func (a *abandonOnStart) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "unnest(") {
		if q := a.q.Swap(nil); q != nil {
			q.state.CompareAndSwap(queuedWaiting, queuedAbandoned)
		}
	}
	return ctx
}

// TraceQueryEnd does nothing.
func (a *abandonOnStart) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
