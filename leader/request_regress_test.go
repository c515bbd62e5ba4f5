package leader_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
)

// rows counts the lease rows whose name matches the LIKE pattern.
func rows(t *testing.T, conn *pgx.Conn, like string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(ctxT(t, 30*time.Second), "select count(*) from pglocks_leases where name like $1", like).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCandidateAndRequestRowsDeleted: a candidate that stops deletes its
// row, and a requester deletes its request's row once answered, so that
// restarts and requests do not grow the lease table.
func TestCandidateAndRequestRowsDeleted(t *testing.T) {
	t.Parallel()
	db := setup(t)
	conn := db.Conn(t)
	a := startCandidate(t, newReplica(t, db.DSN), "gone", "a", nil)
	first := waitEvent(t, a.elected, "a elected")
	b := startCandidate(t, newReplica(t, db.DSN), "gone", "b", nil)
	waitCandidates(t, b.e, 2)
	l, err := leader.RequestResign(ctxT(t, 30*time.Second), newReplica(t, db.DSN).store, "gone")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("term %d → %d (%s)", first.term.Number, l.Term, l.Identity)
	if n := rows(t, conn, `pglocks.leader:gone#req:%`); n != 0 {
		t.Errorf("%d request rows left after the request was answered", n)
	}
	// a takes its candidate row again (the request broke it); a candidate
	// stopped before that leaves the broken row to the sweep.
	waitCandidates(t, b.e, 2)
	a.stop(t)
	b.stop(t)
	if n := rows(t, conn, `pglocks.leader:gone#c:%`); n != 0 {
		var left string
		_ = conn.QueryRow(ctxT(t, 10*time.Second), `select string_agg(format('%s token %s owner %s expires %s', name, token, owner, expires_at - now()), '; ')
			from pglocks_leases where name like 'pglocks.leader:gone#c:%'`).Scan(&left)
		t.Errorf("%d candidate rows left after both candidates stopped: %s", n, left)
	}
	if n := rows(t, conn, `pglocks.leader:gone`); n != 1 {
		t.Errorf("the election's own row: %d rows, want 1 (never deleted)", n)
	}
}

// TestIdleRowsSwept: an elector deletes its election's candidate and
// request rows idle for more than a day (a candidate that died), and no
// other row: not one idle for less, not one whose metadata names another
// election (an election's lease made by an older version under such a
// name).
func TestIdleRowsSwept(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := ctxT(t, time.Minute)
	conn := db.Conn(t)
	ins := func(name, ago, md string) {
		t.Helper()
		if _, err := conn.Exec(ctx, `insert into pglocks_leases (name, owner, token, ttl, acquired_at, renewed_at, expires_at, metadata)
			values ($1, null, 7, '3s', now() - $2::interval, now() - $2::interval, now() - $2::interval, $3::jsonb)`, name, ago, md); err != nil {
			t.Fatal(err)
		}
	}
	ins("pglocks.leader:sweep#c:dead1", "2 days", `{"candidate":"sweep","identity":"dead1"}`)
	ins("pglocks.leader:sweep#c:dead2", "3 days", `{"candidate":"sweep","identity":"dead2"}`)
	ins("pglocks.leader:sweep#req:4", "2 days", `{"election":"sweep","action":"resign"}`)
	ins("pglocks.leader:sweep#c:recent", "1 hour", `{"candidate":"sweep","identity":"recent"}`)
	ins("pglocks.leader:sweep#c:other", "2 days", `{"identity":"x","ttl":"15s"}`)
	c := startCandidate(t, newReplica(t, db.DSN), "sweep", "a", nil)
	waitEvent(t, c.elected, "elected")
	waitCut(t, "the idle rows swept", 30*time.Second, func() bool {
		return rows(t, conn, "pglocks.leader:sweep#c:dead%") == 0 && rows(t, conn, "pglocks.leader:sweep#req:%") == 0
	})
	for _, name := range []string{"pglocks.leader:sweep#c:recent", "pglocks.leader:sweep#c:other"} {
		if rows(t, conn, name) != 1 {
			t.Errorf("%s was deleted", name)
		}
	}
}

// TestRefusedHandOverIsReported: a leader that refuses a hand-over (its
// target died between the requester's check and the leader's) tells the
// requester, which returns an error wrapping ErrNoCandidate at once rather
// than when its ctx ends.
func TestRefusedHandOverIsReported(t *testing.T) {
	t.Parallel()
	db := setup(t)
	a := startCandidate(t, newReplica(t, db.DSN), "refuse", "a", nil)
	waitEvent(t, a.elected, "a elected")
	waitCandidates(t, a.e, 1)
	ctx := ctxT(t, time.Minute)
	ghost := "pglocks.leader:refuse#c:ghost"
	conn := db.Conn(t)
	if _, err := conn.Exec(ctx, `insert into pglocks_leases (name, owner, token, ttl, acquired_at, renewed_at, expires_at, metadata)
		values ($1, gen_random_uuid(), 1, '1 minute', now(), now(), now() + interval '1 minute', '{"candidate":"refuse","identity":"ghost"}')`, ghost); err != nil {
		t.Fatal(err)
	}
	// The requester checks the target, then, just before it writes its
	// request, the target dies (its row expires).
	expire := func(sql string) {
		if strings.Contains(sql, "insert into") {
			if _, err := conn.Exec(context.Background(), "update pglocks_leases set expires_at = now() where name = $1", ghost); err != nil {
				t.Error(err)
			}
		}
	}
	pool := poolWith(t, db.DSN, func(c *pgxpool.Config) { c.ConnConfig.Tracer = sqlHook(expire) })
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close(context.Background()) })
	start := time.Now()
	_, err = leader.RequestHandOver(ctxT(t, 30*time.Second), store, "refuse", "ghost")
	t.Logf("RequestHandOver = %v, after %v", err, time.Since(start))
	if !errors.Is(err, leader.ErrNoCandidate) || !strings.Contains(err.Error(), "refused") {
		t.Errorf("RequestHandOver = %v, want the leader's refusal (ErrNoCandidate)", err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("the refusal took %v to reach the requester", d)
	}
	if _, ok := a.e.Current(); !ok {
		t.Errorf("the leader no longer leads")
	}
}

// sqlHook calls f with the SQL of every query a pool sends.
type sqlHook func(sql string)

func (h sqlHook) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	h(d.SQL)
	return ctx
}

func (sqlHook) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestSecondRequestIsClear: a request for a term for which another, asking
// something else, is under way is refused with an error saying so.
func TestSecondRequestIsClear(t *testing.T) {
	t.Parallel()
	db := setup(t)
	a := startCandidate(t, newReplica(t, db.DSN), "twice", "a", nil)
	ev := waitEvent(t, a.elected, "a elected")
	waitCandidates(t, a.e, 1)
	r := newReplica(t, db.DSN)
	ctx := ctxT(t, 30*time.Second)
	md, _ := json.Marshal(map[string]string{"election": "twice", "action": "handover", "to": "z", "from": "elsewhere"})
	other, err := r.store.TryAcquire(ctx, "pglocks.leader:twice#req:"+strconv.FormatInt(ev.term.Number, 10), 10*time.Second, lease.WithMetadata(md))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Release(context.Background()) }()
	_, err = leader.RequestResign(ctx, r.store, "twice")
	if !errors.Is(err, lease.ErrHeld) || !strings.Contains(err.Error(), "another request for term") {
		t.Errorf("RequestResign = %v, want an error saying another request is under way", err)
	}
}

// TestHandOverAfterResign: a HandOver while a Resign is already ending the
// term says that it did not hand over.
func TestHandOverAfterResign(t *testing.T) {
	t.Parallel()
	db := setup(t)
	r := newReplica(t, db.DSN)
	e, err := leader.New(leader.Config{Name: "late", Identity: "a", Pool: r.pool, Locker: r.locker, Store: r.store,
		TTL: 3 * time.Second, RetryInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	elected := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- e.Run(ctx, func(ctx context.Context, _ leader.Term) error {
			elected <- struct{}{}
			<-ctx.Done()
			<-release // the work is slow to return: the term is still current
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = e.Close(context.Background())
	})
	select {
	case <-elected:
	case <-time.After(30 * time.Second):
		t.Fatal("a not elected")
	}
	startCandidate(t, newReplica(t, db.DSN), "late", "b", nil)
	waitCandidates(t, e, 2)
	rctx, rcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer rcancel()
	_ = e.Resign(rctx) // returns when rctx ends: the work has not returned
	err = e.HandOver(ctxT(t, 10*time.Second), "")
	close(release)
	if !errors.Is(err, leader.ErrResigned) || errors.Is(err, leader.ErrHandedOver) {
		t.Errorf("HandOver after Resign = %v, want an error saying the term was resigned", err)
	}
}
