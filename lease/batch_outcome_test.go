package lease

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pglocks/pglocks/internal/outcome"
	"github.com/pglocks/pglocks/pgtest"
)

// TestQueuedCallGivesUp: a call whose ctx ends while it waits in the queue
// was never sent, and says so (outcome Retry, not Unknown): a TryAcquire
// took nothing; a Release ends its lease as released (not lost), and the
// release goes on in the background, which frees the row. A fast retake whose ctx
// ends once a batch took it returns at once with an unknown outcome; a
// batch that has not sent it yet leaves it out.
func TestQueuedCallGivesUp(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, "a", "b")
	l, err := e.s.TryAcquire(e.ctx, "held", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	busyLanes(e)
	_, tokenA, _ := e.row(t, "a")
	short, cancel := context.WithTimeout(e.ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := e.s.TryAcquire(short, "a", time.Minute); !errors.Is(err, context.DeadlineExceeded) || outcome.Of(err) != outcome.Retry {
		t.Fatalf("queued TryAcquire: %v (%v), want a deadline, not sent", err, outcome.Of(err))
	}
	if err := l.Release(short); !errors.Is(err, context.DeadlineExceeded) || outcome.Of(err) != outcome.Retry || !errors.Is(err, ErrReleased) {
		t.Fatalf("queued Release: %v (%v), want a deadline, not sent, released", err, outcome.Of(err))
	}
	if owner, token, _ := e.row(t, "a"); owner != nil || token != tokenA || !errors.Is(l.Err(), ErrReleased) || e.s.fasts.queued()+e.s.rels.queued() != 0 {
		t.Fatalf("a: owner %v token %d (was %d); lease err %v; queues %d %d", owner, token, tokenA, l.Err(), e.s.fasts.queued(), e.s.rels.queued())
	}
	waitUntil(t, "the background release of the given-up Release", func() bool { owner, _, _ := e.row(t, "held"); return owner == nil })

	gone, cancel := context.WithCancel(e.ctx)
	errc := make(chan error, 1)
	go func() { _, err := e.s.TryAcquire(gone, "b", time.Minute); errc <- err }()
	waitUntil(t, "the retake of b queued", func() bool { return e.s.fasts.queued() == 1 })
	_, tokenB, _ := e.row(t, "b")
	batch := e.s.fasts.take() // the batch goroutine's part: b is in flight
	cancel()
	if err := recv(t, errc); !errors.Is(err, errUnknown) || !errors.Is(err, context.Canceled) {
		t.Fatalf("TryAcquire given up while its batch ran: %v, want an unknown outcome", err)
	}
	if err := e.s.enter(); err != nil {
		t.Fatal(err)
	}
	within(t, "the batch", func() { defer e.s.exit(); e.s.fastBatch(batch) })
	if owner, token, _ := e.row(t, "b"); owner != nil || token != tokenB {
		t.Fatalf("b: owner %v token %d (was %d): the batch sent a retake given up before it ran", owner, token, tokenB)
	}
}

// TestGivenUpInFlightIsUnknown: a call whose ctx ends while its batch runs
// has an unknown outcome whatever the ctx's cause says — here a
// server error a sibling goroutine met (an errgroup's cause), which alone
// would classify as "not done". A Release then ends its lease (the
// release may have run); a TryAcquire reports the unknown outcome.
func TestGivenUpInFlightIsUnknown(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, "a")
	l, err := e.s.TryAcquire(e.ctx, "held", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	busyLanes(e)
	cause := &pgconn.PgError{Severity: "ERROR", Code: "23505", Message: "a sibling's failure"}
	for _, c := range []struct {
		what  string
		call  func(context.Context) error
		take  func() int
		check func(error) bool
	}{
		{"Release", l.Release, func() int { return len(e.s.rels.take()) },
			func(err error) bool { return errors.Is(err, ErrLost) && l.Err() != nil }},
		{"TryAcquire", func(ctx context.Context) error { _, err := e.s.TryAcquire(ctx, "a", time.Minute); return err },
			func() int { return len(e.s.fasts.take()) }, func(err error) bool { return errors.Is(err, errUnknown) }},
	} {
		ctx, cancel := context.WithCancelCause(e.ctx)
		errc := make(chan error, 1)
		go func() { errc <- c.call(ctx) }()
		waitUntil(t, c.what+" queued", func() bool { return e.s.fasts.queued()+e.s.rels.queued() == 1 })
		if n := c.take(); n != 1 { // the batch goroutine's part: in flight
			t.Fatalf("%s: took %d", c.what, n)
		}
		cancel(cause)
		if err := recv(t, errc); outcome.Of(err) != outcome.Unknown || !c.check(err) {
			t.Fatalf("%s given up while its batch ran: %v (%v), want an unknown outcome", c.what, err, outcome.Of(err))
		}
	}
}

// TestBatchErrorRunsAlone: a batch that fails without running — here the
// server refuses one call's metadata, which a check constraint of this
// test's table forbids (metadata that jsonb itself refuses is refused
// before sending now) — fails no call: each runs its statement alone, and
// only the call with the bad metadata fails.
func TestBatchErrorRunsAlone(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, "a", "b")
	if _, err := e.conn.Exec(e.ctx, `alter table pglocks_leases add constraint no_poison check (not coalesce(metadata ? 'poison', false))`); err != nil {
		t.Fatal(err)
	}
	busyLanes(e)
	bad := json.RawMessage(`{"poison": true}`)
	errA, errB := make(chan error, 1), make(chan error, 1)
	go func() { _, err := e.s.TryAcquire(e.ctx, "a", time.Minute); errA <- err }()
	waitUntil(t, "a queued", func() bool { return e.s.fasts.queued() == 1 })
	go func() { _, err := e.s.TryAcquire(e.ctx, "b", time.Minute, WithMetadata(bad)); errB <- err }()
	waitUntil(t, "b queued", func() bool { return e.s.fasts.queued() == 2 })
	batch := e.s.fasts.take()
	if err := e.s.enter(); err != nil {
		t.Fatal(err)
	}
	within(t, "the batch", func() { defer e.s.exit(); e.s.fastBatch(batch) })
	if err := recv(t, errA); err != nil {
		t.Fatalf("a, whose batch failed for b's metadata: %v", err)
	}
	if err := recv(t, errB); outcome.Of(err) != outcome.Fatal || outcome.SQLState(err) != "23514" {
		t.Fatalf("b, with metadata jsonb refuses: %v", err)
	}
	if owner, _, _ := e.row(t, "a"); owner == nil {
		t.Fatal("a not held")
	}
}

// TestUnknownBatch: a batch whose outcome is unknown — its backend ends
// while the commit, flushed locally, waits for a synchronous standby that
// is not there — makes every call's outcome unknown, and what the batch
// took is cleaned up by attempt id.
func TestUnknownBatch(t *testing.T) {
	t.Parallel()
	// A server of its own: synchronous_standby_names is server-wide.
	e := newBatchEnvOn(t, pgtest.NewServer(t).NewDB(t), nil, "a", "b")
	s, ctx := e.s, e.ctx
	syncStandby := func(names string) {
		t.Helper()
		if _, err := e.conn.Exec(ctx, "alter system set synchronous_standby_names = '"+names+"'"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.conn.Exec(ctx, "select pg_reload_conf()"); err != nil {
			t.Fatal(err)
		}
	}
	syncStandby("nobody")
	t.Cleanup(func() { syncStandby("") })
	syncRepOn(t, e)
	busyLanes(e)
	errc := make(chan error, 2)
	for _, n := range []string{"a", "b"} {
		go func() { _, err := s.TryAcquire(ctx, n, time.Minute); errc <- err }()
	}
	waitUntil(t, "both retakes queued", func() bool { return s.fasts.queued() == 2 })
	batch := s.fasts.take()
	if err := s.enter(); err != nil {
		t.Fatal(err)
	}
	go func() { defer s.exit(); s.fastBatch(batch) }()
	waitUntil(t, "the batch's commit waiting for the standby, then ended", func() bool {
		var n int
		err := e.conn.QueryRow(ctx, `select count(pg_terminate_backend(pid)) from pg_stat_activity
			where datname = current_database() and wait_event = 'SyncRep'`).Scan(&n)
		return err == nil && n == 1
	})
	for range 2 {
		if err := recv(t, errc); !errors.Is(err, errUnknown) {
			t.Fatalf("a call of a batch whose outcome is unknown: %v", err)
		}
	}
	for _, q := range batch {
		waitUntil(t, q.name+" taken by the batch, then freed", func() bool {
			owner, _, attempt := e.row(t, q.name)
			return owner == nil && attempt == q.attempt
		})
	}
}

// recv receives from ch, failing the test after 30 s.
func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatal("nothing received within 30 s")
		panic("unreachable")
	}
}

// syncRepOn waits until commits on e's server wait for a synchronous
// standby: a probe commit is seen waiting (then cancelled, which lets it
// commit). A reload takes effect only once the checkpointer has read it.
func syncRepOn(t *testing.T, e batchEnv) {
	t.Helper()
	probe, err := pgx.ConnectConfig(e.ctx, e.conn.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close(context.Background())
	waitUntil(t, "a commit waiting for the standby", func() bool {
		done := make(chan error, 1)
		go func() { _, err := probe.Exec(e.ctx, "select pg_logical_emit_message(true, 'probe', '')"); done <- err }()
		seen := false
		for {
			var n int
			err := e.conn.QueryRow(e.ctx, `select count(pg_cancel_backend(pid)) from pg_stat_activity
				where pid = $1 and wait_event = 'SyncRep'`, probe.PgConn().PID()).Scan(&n)
			if err != nil {
				t.Fatal(err)
			}
			seen = seen || n == 1
			select {
			case <-done:
				return seen
			default:
			}
		}
	})
}
