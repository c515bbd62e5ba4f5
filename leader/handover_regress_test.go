package leader_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
)

// queryCounter counts the queries a pool sends.
type queryCounter struct{ n atomic.Int64 }

func (q *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	q.n.Add(1)
	return ctx
}

func (q *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func poolWith(t *testing.T, dsn string, tweak func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if tweak != nil {
		tweak(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctxT(t, time.Minute), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// replicaOn is a replica whose Locker and Store use the pools given.
func replicaOn(t *testing.T, lockPool, storePool *pgxpool.Pool) replica {
	t.Helper()
	locker, err := advisory.New(lockPool, advisory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	store, err := lease.New(storePool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = store.Close(ctx)
		_ = locker.Close(ctx)
	})
	return replica{lockPool, locker, store}
}

// TestCandidateRowLostDoesNotSpin: a leader whose candidate row another
// process holds (a duplicate Identity, or a break followed by a restart)
// retries taking it with backoff; it neither spins nor stops leading.
func TestCandidateRowLostDoesNotSpin(t *testing.T) {
	t.Parallel()
	db := setup(t)
	qc := &queryCounter{}
	pool := poolWith(t, db.DSN, func(c *pgxpool.Config) { c.ConnConfig.Tracer = qc })
	a := startCandidate(t, replicaOn(t, pool, pool), "spin", "a", nil)
	waitEvent(t, a.elected, "election")
	waitCandidates(t, a.e, 1)
	ctx := ctxT(t, 30*time.Second)
	// Another process takes the row in one statement, so the leader cannot
	// take it back.
	if _, err := db.Conn(t).Exec(ctx, `update pglocks_leases set owner = gen_random_uuid(), token = token + 1,
		expires_at = clock_timestamp() + interval '1 minute' where name = $1`, "pglocks.leader:spin#c:a"); err != nil {
		t.Fatal(err)
	}
	// A measurement window, not a synchronization: the leader hears of
	// the loss at its Store's next keep-alive check, within it, and then
	// must not spin.
	before := qc.n.Load()
	<-time.After(3 * time.Second)
	n := qc.n.Load() - before
	t.Logf("the leader's pool sent %d queries in 3s while leading with a lost candidate row", n)
	if n > 150 {
		t.Errorf("spin: %d queries in 3s (a steady leader sends a few a second)", n)
	}
	if _, ok := a.e.Current(); !ok {
		t.Errorf("no longer leads")
	}
}

// TestRequestDoesNotBlockWatch: while the leader answers a request (its
// queries waiting for a connection of its Store's exhausted pool), the
// loss of its advisory session still cancels its work within Grace, before
// another candidate's term begins.
func TestRequestDoesNotBlockWatch(t *testing.T) {
	t.Parallel()
	db := setup(t)
	storePool := poolWith(t, db.DSN, func(c *pgxpool.Config) { c.MaxConns = 4 })
	ar := replicaOn(t, poolWith(t, db.DSN, nil), storePool)
	tweak := func(c *leader.Config) { c.TTL = 3 * time.Second; c.RetryInterval = 200 * time.Millisecond }
	a := startCandidate(t, ar, "blocked", "a", tweak)
	first := waitEvent(t, a.elected, "a elected")
	b := startCandidate(t, newReplica(t, db.DSN), "blocked", "b", tweak)
	waitCandidates(t, b.e, 2)

	// The leader's work takes every connection of its Store's pool.
	var hog []*pgxpool.Conn
	for {
		actx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		c, err := storePool.Acquire(actx)
		cancel()
		if err != nil {
			break
		}
		hog = append(hog, c)
	}
	defer func() {
		for _, c := range hog {
			c.Release()
		}
	}()
	// A request breaks the candidate row: the leader's Store hears of it
	// (NOTIFY on its listener's own connection) and the leader answers,
	// waiting for a connection.
	r := newReplica(t, db.DSN)
	ctx := ctxT(t, 60*time.Second)
	name := "pglocks.leader:blocked#c:a"
	info, err := r.store.Get(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.store.BreakAcquisition(ctx, name, info.Owner, info.Token); err != nil {
		t.Fatal(err)
	}
	waitCandidates(t, b.e, 1)
	// The leader's lock session dies: it must step down within Grace.
	grace := a.e.Config().Grace
	pid := sessionPID(t, db, a.e)
	if _, err := db.Conn(t).Exec(ctx, "select pg_terminate_backend($1)", int32(pid)); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	select {
	case <-first.term.Context().Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("SAFETY: a's term not over 30s after its lock session was killed")
	}
	d := waitEvent(t, a.demoted, "a demoted")
	t.Logf("a's work cancelled %v after the kill (%v); Grace %v", d.at.Sub(killed), d.reason, grace)
	if late := d.at.Sub(killed); late > grace+time.Second {
		t.Errorf("SAFETY: a's work cancelled %v after its session was killed, more than Grace %v (+1s)", late, grace)
	}
	next := waitEvent(t, b.elected, "b elected")
	t.Logf("b elected %v after the kill, term %d > %d", next.at.Sub(killed), next.term.Number, first.term.Number)
	if next.at.Before(d.at) {
		t.Errorf("SAFETY: b's term began %v before a's work was cancelled", d.at.Sub(next.at))
	}
}

// TestWatchNotBlockedTakingCandidateRow: a leader elected before its
// candidate row was taken takes it while leading; a statement that does
// not return (here a row lock on an old candidate row of the same
// Identity) does not keep the leader from acting on the loss of its lock.
func TestWatchNotBlockedTakingCandidateRow(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := ctxT(t, time.Minute)
	conn := db.Conn(t)
	if _, err := conn.Exec(ctx, `insert into pglocks_leases (name, owner, token, ttl, acquired_at, renewed_at, expires_at)
		values ('pglocks.leader:stuck#c:a', null, 1, '3s', now(), now(), now())`); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `select from pglocks_leases where name = 'pglocks.leader:stuck#c:a' for update`); err != nil {
		t.Fatal(err)
	}
	a := startCandidate(t, newReplica(t, db.DSN), "stuck", "a", nil)
	first := waitEvent(t, a.elected, "a elected")
	b := startCandidate(t, newReplica(t, db.DSN), "stuck", "b", nil)
	waitCandidates(t, b.e, 1) // b's row; a's is blocked
	pid := sessionPID(t, db, a.e)
	if _, err := db.Conn(t).Exec(ctx, "select pg_terminate_backend($1)", int32(pid)); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	select {
	case d := <-a.demoted:
		t.Logf("a's work cancelled %v after the kill", d.at.Sub(killed))
		if late := d.at.Sub(killed); late > a.e.Config().Grace+time.Second {
			t.Errorf("SAFETY: a's work cancelled %v after its session was killed", late)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("SAFETY: a's work (term %d) still live 30s after its lock session was killed", first.term.Number)
	}
	next := waitEvent(t, b.elected, "b elected")
	t.Logf("b elected %v after the kill, term %d > %d", next.at.Sub(killed), next.term.Number, first.term.Number)
}

// TestValueNULRefused: jsonb cannot hold a NUL character: a Value or a
// proclaimed value with one is refused with a clear error.
func TestValueNULRefused(t *testing.T) {
	t.Parallel()
	db := setup(t)
	r := newReplica(t, db.DSN)
	_, err := leader.New(leader.Config{Name: "nul", Pool: r.pool, Locker: r.locker, Store: r.store, Value: "a\x00b"})
	if !errors.Is(err, leader.ErrInvalidConfig) || !strings.Contains(err.Error(), "NUL") {
		t.Errorf("New with a NUL in Value = %v, want ErrInvalidConfig naming the NUL", err)
	}
	c := startCandidate(t, r, "nul2", "a", nil)
	ev := waitEvent(t, c.elected, "elected")
	err = ev.term.Proclaim(ctxT(t, 10*time.Second), "x\x00y")
	if err == nil || !strings.Contains(err.Error(), "NUL") || errors.Is(err, lease.ErrNotHeld) {
		t.Errorf("Proclaim with a NUL = %v, want an error naming the NUL", err)
	}
	if _, ok := c.e.Current(); !ok {
		t.Errorf("no longer leads after the refused Proclaim")
	}
}

// TestReservedElectionNames: an election name holding the forms of the
// candidate and request rows would share their lease rows: it is refused,
// by New and by the functions that need no Elector.
func TestReservedElectionNames(t *testing.T) {
	t.Parallel()
	db := setup(t)
	r := newReplica(t, db.DSN)
	ctx := ctxT(t, 10*time.Second)
	for _, name := range []string{"svc#c:bar", "svc#req:12", "#c:", "a#c:b#c:c"} {
		_, err := leader.New(leader.Config{Name: name, Pool: r.pool, Locker: r.locker, Store: r.store})
		if !errors.Is(err, leader.ErrInvalidConfig) || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("New(%q) = %v, want ErrInvalidConfig saying the form is reserved", name, err)
		}
		if _, err := leader.Candidates(ctx, r.store, name); err == nil || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("Candidates(%q) = %v, want an error saying the form is reserved", name, err)
		}
		if _, err := leader.RequestResign(ctx, r.store, name); err == nil || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("RequestResign(%q) = %v, want an error saying the form is reserved", name, err)
		}
	}
	for _, name := range []string{"svc#1", "svc#c", "svc#req", "a:c#"} {
		if _, err := leader.New(leader.Config{Name: name, Pool: r.pool, Locker: r.locker, Store: r.store}); err != nil {
			t.Errorf("New(%q) = %v, want it accepted", name, err)
		}
	}
}

// TestRequestChecksCandidateRow: a row under the election's candidate name
// that is not that election's candidate row (another election's lease,
// made by a version that allowed the name) is never broken by a request.
func TestRequestChecksCandidateRow(t *testing.T) {
	t.Parallel()
	db := setup(t)
	bar := startCandidate(t, newReplica(t, db.DSN), "svc", "bar", nil)
	waitEvent(t, bar.elected, "bar elected in svc")
	waitCandidates(t, bar.e, 1)
	ctx := ctxT(t, 30*time.Second)
	// The row now looks like another election's lease row.
	if _, err := db.Conn(t).Exec(ctx, `update pglocks_leases set metadata = '{"identity":"x"}' where name = 'pglocks.leader:svc#c:bar'`); err != nil {
		t.Fatal(err)
	}
	info, err := bar.e.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = leader.RequestResign(ctx, newReplica(t, db.DSN).store, "svc")
	if err == nil || !strings.Contains(err.Error(), "not its candidate row") {
		t.Errorf("RequestResign = %v, want a refusal: the row is not svc's candidate row", err)
	}
	row, err := newReplica(t, db.DSN).store.Get(ctx, "pglocks.leader:svc#c:bar")
	if err != nil || !row.Held {
		t.Errorf("the row was broken: %+v %v", row, err)
	}
	if cur, ok := bar.e.Current(); !ok || cur.Number != info.Term {
		t.Errorf("bar's term %d changed: %+v %v", info.Term, cur, ok)
	}
}
