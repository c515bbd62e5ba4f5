package leader_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/pgtest"
)

// member is a candidate of the lease-only tests: its elector and replica.
type member struct {
	id string
	e  *leader.Elector
	r  replica
}

// loss ends m's leadership one way: "Resign", "Close", or "Crash" — its
// Store is closed under it, which abandons the lease unreleased, as a
// killed process leaves it. It returns whether m is gone for good.
func loss(t *testing.T, m member, how string) bool {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	var err error
	switch how {
	case "Resign":
		err = m.e.Resign(ctx)
	case "Close":
		err = m.e.Close(ctx)
	case "Crash":
		err = m.r.store.Close(ctx)
	}
	if err != nil {
		t.Fatalf("%s %s: %v", how, m.id, err)
	}
	return how != "Resign"
}

// TestLeaseOnlyBehindTransactionPooling: behind a transaction-mode
// PgBouncer an elector in the default mode falls back to the lease alone
// (logged once, shown by State): it is elected, its work gets a Term whose
// Guard works, and after the leader resigns, closes or crashes another
// candidate takes over within TTL + RetryInterval (and slack), in a higher
// term, with no two terms trusted at once.
func TestLeaseOnlyBehindTransactionPooling(t *testing.T) {
	t.Parallel()
	db := setup(t)
	_, dsn := db.Bouncer(t, pgtest.PoolTransaction)
	const ttl, retry = 2 * time.Second, 200 * time.Millisecond
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	book := newTrustBook()
	members := map[string]member{}
	n := 0
	join := func() {
		n++
		m := member{id: fmt.Sprintf("p%d", n), r: newReplica(t, dsn)}
		m.e = newElector(t, m.r, "pooled", m.id, func(c *leader.Config) { c.TTL, c.RetryInterval, c.Logger = ttl, retry, logger })
		runWork(t, m.e, book.work(m.id))
		members[m.id] = m
	}
	join()
	join()
	ctx := ctxT(t, 5*time.Minute)
	took := map[string][]time.Duration{}
	ev := waitEvent(t, book.elected, "the first election")
	for round := range 3 * trials(t, 3) {
		lead := members[ev.who]
		if st := lead.e.State(); st.Mode != leader.ModeLeaseOnly || !st.Leading || st.Term != ev.term.Number {
			t.Fatalf("leader's State %+v, want lease-only, leading term %d", st, ev.term.Number)
		}
		if round == 0 { // a fenced write through the bouncer
			if err := pgx.BeginFunc(ctx, lead.r.pool, func(tx pgx.Tx) error { return ev.term.Guard(ctx, tx) }); err != nil {
				t.Fatalf("Guard of a live term: %v", err)
			}
		}
		how := []string{"Resign", "Close", "Crash"}[round%3]
		lost := time.Now()
		if loss(t, lead, how) {
			delete(members, lead.id)
			join()
		}
		next := waitEvent(t, book.elected, "the takeover after "+how)
		took[how] = append(took[how], next.at.Sub(lost))
		if d := next.at.Sub(lost); d > ttl+retry+10*time.Second {
			t.Errorf("%s: the next leader after %v, want within TTL + RetryInterval (and slack)", how, d)
		}
		if how != "Resign" && next.who == lead.id {
			t.Fatalf("%s: %s leads again", how, next.who)
		}
		if next.term.Number <= ev.term.Number {
			t.Fatalf("term %d elected after term %d", next.term.Number, ev.term.Number)
		}
		ev = next
	}
	for how, d := range took {
		t.Logf("failover behind transaction pooling after %s: %s", how, summary(d))
	}
	book.mu.Lock()
	for _, o := range book.overlaps {
		t.Error(o)
	}
	book.mu.Unlock()
	if c := strings.Count(logs.String(), "campaigning on the lease alone"); c == 0 || c > n {
		t.Errorf("%d fallback warnings from %d electors; log:\n%s", c, n, logs.String())
	}
}

// TestLeaseOnlyDirect: in ModeLeaseOnly over a direct connection no Locker
// is made and no advisory lock taken; the lease row records the mode and no
// horizon; a resignation hands over at once (the release wakes the other
// candidate), and a crashed leader's lease is taken only once it expired by
// the server clock.
func TestLeaseOnlyDirect(t *testing.T) {
	t.Parallel()
	db := setup(t)
	book := newTrustBook()
	members := map[string]member{}
	for _, id := range []string{"a", "b"} {
		m := member{id: id, r: newReplica(t, db.DSN)}
		m.e = newElector(t, m.r, "leaseonly", id, func(c *leader.Config) { c.Mode, c.Locker = leader.ModeLeaseOnly, nil })
		if m.e.Config().Locker != nil {
			t.Fatal("a lease-only elector made a Locker")
		}
		runWork(t, m.e, book.work(id))
		members[id] = m
	}
	ctx := ctxT(t, 2*time.Minute)
	ev := waitEvent(t, book.elected, "the first election")
	lead := members[ev.who]
	if st := lead.e.State(); st.Mode != leader.ModeLeaseOnly || !st.Leading {
		t.Fatalf("State %+v", st)
	}
	var locks int
	var md []byte
	classid, objid, objsubid := lead.e.Key().LockTag()
	if err := db.Conn(t).QueryRow(ctx, `select (select count(*) from pg_locks where locktype = 'advisory'
		and database = (select oid from pg_database where datname = current_database())
		and classid = $1 and objid = $2 and objsubid = $3),
		(select metadata from pglocks_leases where name = 'pglocks.leader:leaseonly')`,
		classid, objid, objsubid).Scan(&locks, &md); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(md, &m); err != nil || m["campaign"] != "lease-only" || m["grace"] != nil || locks != 0 {
		t.Fatalf("%d advisory locks; lease metadata %s (%v); want none, campaign lease-only, no grace", locks, md, err)
	}
	lost := time.Now()
	loss(t, lead, "Resign")
	next := waitEvent(t, book.elected, "the takeover after Resign")
	t.Logf("%s resigned: %s elected after %v", ev.who, next.who, next.at.Sub(lost).Round(time.Millisecond))
	if next.term.Number <= ev.term.Number {
		t.Fatalf("term %d after term %d", next.term.Number, ev.term.Number)
	}
	lead, other := members[next.who], members[ev.who]
	loss(t, lead, "Crash")
	old, err := other.e.Leader(ctx) // no renewal can follow: its expiry is final
	if err != nil {
		t.Fatal(err)
	}
	if !old.Held || old.Term != next.term.Number {
		t.Fatalf("after the crash of %s (term %d) the row shows %+v, want its term held", lead.id, next.term.Number, old)
	}
	lost = time.Now()
	taken := waitEvent(t, book.elected, "the takeover after a crash")
	t.Logf("%s crashed: %s elected after %v", lead.id, taken.who, taken.at.Sub(lost).Round(time.Millisecond))
	now, err := other.e.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if taken.who == lead.id || now.Term != taken.term.Number || now.Since.Before(old.Expiry) {
		t.Fatalf("after the crash of %s (term %d, expiry %v): %s term %d since %v; want the other, once expired",
			lead.id, old.Term, old.Expiry, taken.who, now.Term, now.Since)
	}
	book.mu.Lock()
	defer book.mu.Unlock()
	for _, o := range book.overlaps {
		t.Error(o)
	}
}

// TestMixedModesNoOverlap: a session-mode and a lease-only candidate in one
// election. A lease-only leader holds no advisory lock, so the session
// candidate takes it at once and waits on the lease: it must wait for the
// lease to be released or to expire — not break it after a Grace, as it
// would a session-mode predecessor's — and terminate nothing. The
// lease-only candidate in turn takes over from the session-mode leader only
// once that one has released. No two candidates ever trust a term at once,
// and terms increase.
func TestMixedModesNoOverlap(t *testing.T) {
	t.Parallel()
	db := setup(t)
	book := newTrustBook()
	sR, lR := newReplica(t, db.DSN), newReplica(t, db.DSN)
	sess := newElector(t, sR, "mixed-modes", "session", func(c *leader.Config) { c.Mode = leader.ModeSession })
	lo := newElector(t, lR, "mixed-modes", "lease", func(c *leader.Config) { c.Mode = leader.ModeLeaseOnly })
	runWork(t, sess, book.work("session"))
	runWork(t, lo, book.work("lease"))
	grace := sess.Config().Grace
	want, fromLease, fromSession := trials(t, 4), 0, 0
	var last int64
	for fromLease < want || fromSession < want {
		ev := waitEvent(t, book.elected, "an election")
		if ev.term.Number <= last {
			t.Fatalf("term %d elected after term %d", ev.term.Number, last)
		}
		last = ev.term.Number
		if ev.who == "lease" {
			// The session candidate takes the free advisory lock and waits
			// on the lease; a taker that treated this leader as a
			// session-mode one would break its lease after its Grace.
			waitLocked(t, db, sess)
			<-time.After(2 * grace) // the scenario: a term that outlasts the taker's Grace
			if cur, ok := lo.Current(); !ok || cur.Number != ev.term.Number {
				t.Errorf("the lease-only leader lost term %d while the session candidate waited (now term %d, %v)", ev.term.Number, cur.Number, ok)
				break
			}
			loss(t, member{"lease", lo, lR}, "Resign")
			fromLease++
			continue
		}
		if fromSession%2 == 0 {
			if err := db.Server.TerminateBackend(ctxT(t, 30*time.Second), sessionPID(t, db, sess)); err != nil {
				t.Fatal(err)
			}
		} else {
			loss(t, member{"session", sess, sR}, "Resign")
		}
		fromSession++
	}
	book.mu.Lock()
	defer book.mu.Unlock()
	for _, o := range book.overlaps {
		t.Error(o)
	}
	t.Logf("%d lease-only and %d session-mode terms handed over; %d overlaps", fromLease, fromSession, len(book.overlaps))
}

// waitLocked waits until some session holds e's advisory lock.
func waitLocked(t *testing.T, db *pgtest.DB, e *leader.Elector) {
	t.Helper()
	classid, objid, objsubid := e.Key().LockTag()
	conn := db.Conn(t)
	for deadline := time.Now().Add(30 * time.Second); ; {
		var held bool
		if err := conn.QueryRow(ctxT(t, 30*time.Second), `select exists (select from pg_locks
			where locktype = 'advisory' and granted and classid = $1 and objid = $2 and objsubid = $3
			  and database = (select oid from pg_database where datname = current_database()))`,
			classid, objid, objsubid).Scan(&held); err != nil {
			t.Fatal(err)
		}
		if held {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the session candidate never took the advisory lock")
		}
		<-time.After(10 * time.Millisecond) // polling a condition, with a deadline
	}
}
