package leader_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// replica is one candidate with connections of its own, as a separate
// process would have.
type replica struct {
	pool   *pgxpool.Pool
	locker *advisory.Locker
	store  *lease.Store
}

func newReplica(t *testing.T, dsn string) replica {
	t.Helper()
	return newReplicaWith(t, dsn, advisory.Config{}, lease.Config{})
}

// setup returns a fresh database with the lease table.
func setup(t *testing.T) *pgtest.DB {
	t.Helper()
	db := pgtest.New(t)
	migrate(t, db)
	return db
}

// migrate creates the lease table in db.
func migrate(t *testing.T, db *pgtest.DB) {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	pool, err := pgxpool.New(ctx, db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close(ctx)
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// event is what a candidate's work reports.
type event struct {
	who    string
	term   leader.Term
	at     time.Time
	reason error // for a demotion
}

// candidate runs an elector whose work reports elections and demotions.
type candidate struct {
	e        *leader.Elector
	elected  chan event
	demoted  chan event
	cancel   context.CancelFunc
	runDone  chan error
	identity string
}

func startCandidate(t *testing.T, r replica, name, identity string, tweak func(*leader.Config)) *candidate {
	t.Helper()
	return startCandidateTo(t, r, name, identity, tweak, make(chan event, 100))
}

// startCandidateTo is startCandidate reporting elections to a channel that
// several candidates may share.
func startCandidateTo(t *testing.T, r replica, name, identity string, tweak func(*leader.Config), elected chan event) *candidate {
	t.Helper()
	cfg := leader.Config{
		Name: name, Pool: r.pool, Locker: r.locker, Store: r.store, Identity: identity,
		TTL: 3 * time.Second, RetryInterval: 200 * time.Millisecond,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	e, err := leader.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &candidate{e: e, elected: elected, demoted: make(chan event, 100),
		runDone: make(chan error, 1), identity: identity}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() {
		c.runDone <- e.Run(ctx, func(ctx context.Context, term leader.Term) error {
			c.elected <- event{who: identity, term: term, at: time.Now()}
			<-ctx.Done()
			c.demoted <- event{who: identity, term: term, at: time.Now(), reason: context.Cause(ctx)}
			return nil
		})
	}()
	t.Cleanup(func() { c.stop(t) })
	return c
}

// stop ends Run and waits for it.
func (c *candidate) stop(t *testing.T) {
	c.cancel()
	select {
	case err := <-c.runDone:
		if err != nil {
			t.Errorf("%s: Run: %v", c.identity, err)
		}
		c.runDone <- nil // later stops return at once
	case <-time.After(30 * time.Second):
		t.Errorf("%s: Run did not return after its ctx ended", c.identity)
	}
}

func waitEvent(t *testing.T, ch <-chan event, what string) event {
	t.Helper()
	select {
	case ev := <-ch:
		return ev
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		return event{}
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pool := db.NewPool(t)
	if _, err := leader.New(leader.Config{Name: "x"}); err == nil || !strings.Contains(err.Error(), "Pool") {
		t.Errorf("nil Pool: %v", err)
	}
	for _, tc := range []struct {
		name string
		cfg  leader.Config
		want string
	}{
		{"EmptyName", leader.Config{}, "Name"},
		{"NULName", leader.Config{Name: "a\x00"}, "NUL"},
		{"LongName", leader.Config{Name: strings.Repeat("n", 901)}, "Name is 901 bytes"},
		{"NegativeTTL", leader.Config{Name: "x", TTL: -time.Second}, "negative"},
		{"TinyTTL", leader.Config{Name: "x", TTL: time.Millisecond}, "TTL"},
		{"RenewTooSlow", leader.Config{Name: "x", TTL: 10 * time.Second, RenewInterval: 6 * time.Second}, "RenewInterval 6s must be below TTL/2"},
		{"GraceTooShort", leader.Config{Name: "x", Grace: time.Millisecond}, "Grace"},
		{"GraceTooLong", leader.Config{Name: "x", TTL: time.Second, Grace: 2 * time.Second}, "Grace 2s must be below TTL"},
		{"BadMode", leader.Config{Name: "x", Mode: leader.ModeLeaseOnly + 1}, "Mode 3"},
		{"BadChannel", leader.Config{Name: "x", Channel: "no-dashes"}, "Channel"},
		{"TTLAboveStoreMax", leader.Config{Name: "x", TTL: 48 * time.Hour}, "exceeds the Store's MaxTTL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Pool = pool
			_, err := leader.New(tc.cfg)
			if !errors.Is(err, leader.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
		})
	}
	// A lease-only campaign has no session: Grace, which bounds trust in
	// one, does not constrain its TTL.
	e, err := leader.New(leader.Config{Name: "x", Pool: pool, Mode: leader.ModeLeaseOnly, TTL: 500 * time.Millisecond})
	if err != nil {
		t.Fatalf("lease-only with TTL 500ms (below the default Grace): %v", err)
	}
	_ = e.Close(ctxT(t, 10*time.Second))
}

func TestSingleCandidate(t *testing.T) {
	t.Parallel()
	db := setup(t)
	r := newReplica(t, db.DSN)
	c := startCandidate(t, r, "solo", "solo-1", nil)
	ev := waitEvent(t, c.elected, "election")
	if ev.term.Number < 1 || ev.term.Identity != "solo-1" || ev.term.Election != "solo" {
		t.Fatalf("term %+v", ev.term)
	}
	if cur, ok := c.e.Current(); !ok || cur.Number != ev.term.Number {
		t.Fatalf("Current() = %+v, %v", cur, ok)
	}
	l, err := c.e.Leader(ctxT(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !l.Held || l.Identity != "solo-1" || l.Term != ev.term.Number {
		t.Fatalf("Leader() = %+v", l)
	}
	if err := c.e.Resign(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	d := waitEvent(t, c.demoted, "demotion")
	if !errors.Is(d.reason, leader.ErrResigned) {
		t.Fatalf("demoted because %v, want ErrResigned", d.reason)
	}
	// Alone, it is elected again after sitting out, in a later term.
	again := waitEvent(t, c.elected, "re-election")
	if again.term.Number <= ev.term.Number {
		t.Fatalf("term %d after term %d", again.term.Number, ev.term.Number)
	}
	c.stop(t)
	d = waitEvent(t, c.demoted, "demotion at stop")
	if !errors.Is(d.reason, leader.ErrStopped) {
		t.Fatalf("demoted because %v, want ErrStopped", d.reason)
	}
	l, err = c.e.Leader(ctxT(t, 30*time.Second))
	if err != nil || l.Held {
		t.Fatalf("after Run returned the lease is still held: %+v, %v", l, err)
	}
}

func TestFailoverInProcess(t *testing.T) {
	t.Parallel()
	for _, fault := range []string{"Resign", "TerminateSession"} {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			db := setup(t)
			elected := make(chan event, 100)
			a := startCandidateTo(t, newReplica(t, db.DSN), "pair", "a", nil, elected)
			b := startCandidateTo(t, newReplica(t, db.DSN), "pair", "b", nil, elected)
			ev := waitEvent(t, elected, "first election")
			lead, other := a, b
			if ev.who == "b" {
				lead, other = b, a
			}
			start := time.Now()
			switch fault {
			case "Resign":
				if err := lead.e.Resign(ctxT(t, 30*time.Second)); err != nil {
					t.Fatal(err)
				}
			case "TerminateSession":
				pid := sessionPID(t, db, lead.e)
				if err := db.Server.TerminateBackend(ctxT(t, 30*time.Second), pid); err != nil {
					t.Fatal(err)
				}
			}
			d := waitEvent(t, lead.demoted, "old leader's demotion")
			next := waitEvent(t, elected, "new leader")
			if next.who != other.identity {
				t.Logf("the old leader %s was re-elected first", next.who)
			}
			if next.term.Number <= ev.term.Number {
				t.Fatalf("new term %d not above %d", next.term.Number, ev.term.Number)
			}
			if !d.at.Before(next.at) {
				t.Fatalf("new leader elected at %v before the old one stepped down at %v", next.at, d.at)
			}
			t.Logf("%s: new leader after %v", fault, next.at.Sub(start).Round(time.Millisecond))
		})
	}
}

// sessionPID finds the backend holding the election's advisory lock.
func sessionPID(t *testing.T, db *pgtest.DB, e *leader.Elector) uint32 {
	t.Helper()
	classid, objid, objsubid := e.Key().LockTag()
	var pid int32
	// pg_locks spans databases; parallel tests run the same election in theirs.
	err := db.Conn(t).QueryRow(ctxT(t, 30*time.Second), `select pid from pg_locks
		where locktype = 'advisory' and granted and classid = $1 and objid = $2 and objsubid = $3
		  and database = (select oid from pg_database where datname = current_database())`,
		classid, objid, objsubid).Scan(&pid)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(pid)
}

func TestTermFencing(t *testing.T) {
	t.Parallel()
	db := setup(t)
	r := newReplica(t, db.DSN)
	ctx := ctxT(t, time.Minute)
	if _, err := r.pool.Exec(ctx, "create table ledger (term bigint)"); err != nil {
		t.Fatal(err)
	}
	a := startCandidate(t, r, "fenced", "a", nil)
	old := waitEvent(t, a.elected, "election")
	write := func(term leader.Term) error {
		return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			if err := term.Guard(ctx, tx); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "insert into ledger values ($1)", term.Number)
			return err
		})
	}
	if err := write(old.term); err != nil {
		t.Fatalf("current term's guarded write: %v", err)
	}
	if err := a.e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, a.demoted, "demotion")
	if err := write(old.term); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("a deposed term's guarded write: %v, want lease.ErrNotHeld", err)
	}
}

// A Store closed under a leader ends its term at once, not at the trust
// deadline.
func TestStoreClosedUnderLeader(t *testing.T) {
	t.Parallel()
	db := setup(t)
	r := newReplica(t, db.DSN)
	c := startCandidate(t, r, "closing", "c", func(cfg *leader.Config) { cfg.TTL = time.Minute })
	waitEvent(t, c.elected, "election")
	if err := r.store.Close(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-c.demoted:
		if !errors.Is(d.reason, leader.ErrLost) {
			t.Fatalf("demoted because %v, want ErrLost", d.reason)
		}
	case <-time.After(20 * time.Second): // the trust deadline is 54s away
		t.Fatal("the leader did not notice its Store closing")
	}
	// A closed Store cannot be campaigned with: Run ends with its error,
	// once the next campaign meets it (before, the test's own cancel
	// raced it, and Run's ErrClosed failed the cleanup once in a CI loop).
	select {
	case err := <-c.runDone:
		c.runDone <- nil // for the cleanup's stop, which would wait for it
		if !errors.Is(err, lease.ErrClosed) {
			t.Fatalf("Run after its Store closed: %v, want lease.ErrClosed", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its Store closed")
	}
}

func TestObserve(t *testing.T) {
	t.Parallel()
	db := setup(t)
	r := newReplica(t, db.DSN)
	watcher, err := leader.New(leader.Config{Name: "observed", Pool: r.pool, Locker: r.locker, Store: r.store,
		RetryInterval: time.Hour}) // changes must arrive by notification, not polling
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, time.Minute)
	updates := watcher.Observe(ctx)
	next := func(what string) leader.Leader {
		t.Helper()
		select {
		case l := <-updates:
			return l
		case <-ctx.Done():
			t.Fatalf("no update: %s", what)
			return leader.Leader{}
		}
	}
	if l := next("initial state"); l.Held {
		t.Fatalf("initial state %+v, want no leader", l)
	}
	c := startCandidate(t, newReplica(t, db.DSN), "observed", "obs-1", nil)
	ev := waitEvent(t, c.elected, "election")
	l := next("election")
	if !l.Held || l.Identity != "obs-1" || l.Term != ev.term.Number {
		t.Fatalf("after election: %+v", l)
	}
	if err := c.e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if l := next("resignation"); l.Held {
		t.Fatalf("after resignation: %+v", l)
	}
}

func TestHooksNeverBlockTheElection(t *testing.T) {
	t.Parallel()
	db := setup(t)
	release := make(chan struct{})
	defer close(release)
	var mu sync.Mutex
	var calls []string
	hook := func(s string) {
		mu.Lock()
		calls = append(calls, s)
		mu.Unlock()
		<-release // blocks until the test ends
	}
	c := startCandidate(t, newReplica(t, db.DSN), "hooked", "h", func(cfg *leader.Config) {
		cfg.OnElected = func(leader.Term) { hook("elected") }
		cfg.OnDemoted = func(leader.Term, error) { hook("demoted") }
	})
	waitEvent(t, c.elected, "election")
	if err := c.e.Resign(ctxT(t, 30*time.Second)); err != nil {
		t.Fatalf("Resign with a blocked hook: %v", err)
	}
	waitEvent(t, c.elected, "re-election with a blocked hook")
}
