package leader_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
)

// newReplicaWith is newReplica with its own Locker and Store settings.
func newReplicaWith(t *testing.T, dsn string, ac advisory.Config, lc lease.Config) replica {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(viaPooler(t, dsn))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctxT(t, time.Minute), cfg)
	if err != nil {
		t.Fatal(err)
	}
	locker, err := advisory.New(pool, ac)
	if err != nil {
		t.Fatal(err)
	}
	store, err := lease.New(pool, lc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = store.Close(ctx)
		_ = locker.Close(ctx)
		pool.Close()
	})
	return replica{pool, locker, store}
}

// runWork starts an elector's Run with work, and stops it at cleanup.
func runWork(t *testing.T, e *leader.Elector, work func(context.Context, leader.Term) error) chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx, work) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("Run did not return after its ctx ended")
		}
	})
	return done
}

func newElector(t *testing.T, r replica, name, id string, tweak func(*leader.Config)) *leader.Elector {
	t.Helper()
	cfg := leader.Config{Name: name, Pool: r.pool, Locker: r.locker, Store: r.store, Identity: id,
		TTL: 3 * time.Second, RetryInterval: 200 * time.Millisecond}
	if tweak != nil {
		tweak(&cfg)
	}
	e, err := leader.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// trustBook records which candidates trust a term now, and every term that
// began while another candidate still trusted its own.
type trustBook struct {
	mu       sync.Mutex
	live     map[string]liveTerm
	overlaps []string
	elected  chan event
}

type liveTerm struct {
	ctx  context.Context
	term leader.Term
}

func newTrustBook() *trustBook {
	return &trustBook{live: map[string]liveTerm{}, elected: make(chan event, 1000)}
}

// work is a leader's work that, as it starts, checks that no other
// candidate trusts its term at that instant: its work context is live and
// its TrustedUntil has not passed.
func (b *trustBook) work(who string) func(context.Context, leader.Term) error {
	return func(ctx context.Context, term leader.Term) error {
		b.mu.Lock()
		now := time.Now()
		for other, lt := range b.live {
			if other == who {
				continue
			}
			if until := lt.term.TrustedUntil(); lt.ctx.Err() == nil && now.Before(until) {
				b.overlaps = append(b.overlaps, fmt.Sprintf("%s term %d began while %s term %d was trusted for another %v",
					who, term.Number, other, lt.term.Number, until.Sub(now).Round(time.Millisecond)))
			}
		}
		b.live[who] = liveTerm{ctx, term}
		b.mu.Unlock()
		b.elected <- event{who: who, term: term, at: now}
		<-ctx.Done()
		b.mu.Lock()
		if b.live[who].term.Number == term.Number {
			delete(b.live, who)
		}
		b.mu.Unlock()
		return nil
	}
}

// TestMixedSettingsNoOverlap: candidates with different PingInterval
// and Grace take over from each other; the taker must wait for the
// holder's horizon, not its own, so no two candidates ever trust a term at
// once.
func TestMixedSettingsNoOverlap(t *testing.T) {
	t.Parallel()
	db := setup(t)
	slowR := newReplicaWith(t, db.DSN, advisory.Config{PingInterval: 400 * time.Millisecond}, lease.Config{})
	fastR := newReplicaWith(t, db.DSN, advisory.Config{PingInterval: 50 * time.Millisecond}, lease.Config{})
	book := newTrustBook()
	slow := newElector(t, slowR, "mixed", "slow", nil) // Grace 1.2s
	fast := newElector(t, fastR, "mixed", "fast", nil) // Grace 150ms
	runWork(t, slow, book.work("slow"))
	runWork(t, fast, book.work("fast"))
	want := trials(t, 20)
	takeovers := 0
	ev := waitEvent(t, book.elected, "an election")
	for takeovers < want {
		if ev.who == "fast" {
			if err := fast.Resign(ctxT(t, 30*time.Second)); err != nil {
				t.Fatal(err)
			}
			ev = waitEvent(t, book.elected, "an election")
			continue
		}
		// slow leads: terminate its session; fast, whose Grace is short,
		// takes over while slow has not noticed yet — or slow, having
		// noticed first (its sitting-out fast was still sitting out), leads
		// again, and is terminated again.
		if err := db.Server.TerminateBackend(ctxT(t, 30*time.Second), sessionPID(t, db, slow)); err != nil {
			t.Fatal(err)
		}
		ev = waitEvent(t, book.elected, "the takeover")
		if ev.who == "fast" {
			takeovers++
		}
	}
	book.mu.Lock()
	defer book.mu.Unlock()
	for _, o := range book.overlaps {
		t.Error(o)
	}
	t.Logf("%d takeovers from a candidate with a longer Grace; %d overlaps", takeovers, len(book.overlaps))
}

// TestRunReturnsFatalCampaignError: a campaign that cannot succeed — here
// the lease table does not exist — makes Run return the cause, an error
// wrapping lease.ErrNoTable that says how to create the table: when the
// candidate takes the campaign lock, when another candidate holds it (the
// candidate reads the lease row while it waits), and with the elector's
// own Store on a database never migrated, in either mode.
func TestRunReturnsFatalCampaignError(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		another bool
		own     bool
		mode    leader.Mode
	}{
		{name: "Alone"},
		{name: "WhileAnotherLeads", another: true},
		{name: "OwnStore", own: true},
		{name: "OwnStoreLeaseOnly", own: true, mode: leader.ModeLeaseOnly},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db := setup(t)
			if c.another {
				c := startCandidate(t, newReplica(t, db.DSN), "fatal", "good", nil)
				waitEvent(t, c.elected, "the other candidate's election")
			}
			pool := db.NewPool(t)
			table := "public.pglocks_leases"
			cfg := leader.Config{Name: "fatal", Pool: pool, Mode: c.mode, RetryInterval: 200 * time.Millisecond}
			if c.own {
				if _, err := pool.Exec(t.Context(), "drop table pglocks_leases"); err != nil {
					t.Fatal(err)
				}
			} else {
				store, err := lease.New(pool, lease.Config{Table: "no_such_table"})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = store.Close(context.Background()) })
				cfg.Store, table = store, "public.no_such_table"
			}
			e, err := leader.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = e.Close(context.Background()) })
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			start := time.Now()
			err = e.Run(ctx, func(context.Context, leader.Term) error { return nil })
			took := time.Since(start)
			t.Logf("Run returned after %v: %v", took.Round(time.Millisecond), err)
			if err == nil || !strings.Contains(err.Error(), table) || took > 2*time.Second {
				t.Fatalf("Run returned after %v: %v; want an error naming %s within 2s", took.Round(time.Millisecond), err, table)
			}
			if !errors.Is(err, lease.ErrNoTable) || !strings.Contains(err.Error(), "Store.Migrate") {
				t.Errorf("Run: %v; want it to wrap lease.ErrNoTable and name Store.Migrate", err)
			}
			if st := e.State(); st.LastError == nil || st.Running || st.Leading {
				t.Errorf("State after Run returned: %+v", st)
			}
		})
	}
}

// TestSkewedStoreClock: a Store whose Now is an hour off elects and
// runs work, and keeps leading across renewals.
func TestSkewedStoreClock(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{-time.Hour, time.Hour} {
		t.Run(fmt.Sprint(skew), func(t *testing.T) {
			t.Parallel()
			db := setup(t)
			r := newReplicaWith(t, db.DSN, advisory.Config{},
				lease.Config{Now: func() time.Time { return time.Now().Add(skew) }})
			// The test is about the Store's clock, which only the lease
			// reads: a lease-only campaign, so that no advisory session's
			// ping can end the term, and a TTL that leaves room for a
			// loaded machine's stalls (with a 1 s TTL it lost its term once
			// under three packages' -race load; in session mode, once when
			// a ping went unanswered for its timeout under CI and a CPU hog).
			c := startCandidate(t, r, "skewed", "s", func(cfg *leader.Config) {
				cfg.TTL, cfg.Mode = 6*time.Second, leader.ModeLeaseOnly
			})
			select {
			case <-c.elected:
			case <-time.After(15 * time.Second):
				t.Fatal("no work started within 15s")
			}
			select { // several renewals (every TTL/3)
			case d := <-c.demoted:
				t.Fatalf("demoted: %v", d.reason)
			case <-time.After(7 * time.Second): // the span to watch, not a synchronization
			}
		})
	}
}

// countingTracer counts the statements that read or write the lease table.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "pglocks_leases") {
		c.n.Add(1)
	}
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestObserveReadsOnlyOwnNews: notifications about other elections
// on the shared channel cause no read of the observed election's row.
func TestObserveReadsOnlyOwnNews(t *testing.T) {
	t.Parallel()
	db := setup(t)
	tracer := &countingTracer{}
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer })
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close(context.Background()) })
	w, err := leader.New(leader.Config{Name: "watched", Pool: pool, Store: store, RetryInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	ctx := ctxT(t, time.Minute)
	updates := w.Observe(ctx)
	if l := <-updates; l.Held {
		t.Fatalf("initial %+v", l)
	}
	conn := db.Conn(t)
	const foreign = 200
	for i := range foreign {
		if _, err := conn.Exec(ctx, "select pg_notify($1, $2)", leader.DefaultChannel, fmt.Sprintf("other-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Then real news of our own: it is read after the foreign ones.
	other := newReplica(t, db.DSN)
	if _, err := other.store.TryAcquire(ctx, "pglocks.leader:watched", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "select pg_notify($1, $2)", leader.DefaultChannel, "watched"); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-updates:
		if !l.Held {
			t.Fatalf("after our news: %+v", l)
		}
	case <-ctx.Done():
		t.Fatal("no update after our own news")
	}
	reads := tracer.n.Load()
	t.Logf("%d foreign notifications and 1 of our own: %d reads", foreign, reads)
	if reads > 3 {
		t.Errorf("%d reads of the lease table, want 2 (initial, our news)", reads)
	}
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRetryableCampaignError: a campaign that fails for a passing reason
// (here statements time out behind a table lock) is retried, logged at
// Warn and reported by State; once the reason passes, the candidate is
// elected, and State shows the term.
func TestRetryableCampaignError(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := ctxT(t, time.Minute)
	blocker, err := db.Conn(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Exec(ctx, "lock table pglocks_leases in access exclusive mode"); err != nil {
		t.Fatal(err)
	}
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["statement_timeout"] = "100" })
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close(context.Background()) })
	logs := &syncBuffer{}
	e, err := leader.New(leader.Config{Name: "retry", Pool: pool, Store: store, RetryInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	elected := make(chan leader.Term, 1)
	runWork(t, e, func(ctx context.Context, term leader.Term) error {
		elected <- term
		<-ctx.Done()
		return nil
	})
	for deadline := time.Now().Add(30 * time.Second); e.State().LastError == nil; {
		if time.Now().After(deadline) {
			t.Fatal("no campaign error reported by State")
		}
		<-time.After(5 * time.Millisecond) // polling a condition, with a deadline
	}
	st := e.State()
	t.Logf("State while blocked: %+v", st)
	if !st.Running || st.Leading || !strings.Contains(st.LastError.Error(), "57014") {
		t.Errorf("State %+v, want running, not leading, a statement timeout", st)
	}
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var term leader.Term
	select {
	case term = <-elected:
	case <-ctx.Done():
		t.Fatal("not elected after the table lock was released")
	}
	if st := e.State(); !st.Leading || st.Term != term.Number || !st.TrustedUntil.After(time.Now()) {
		t.Errorf("State while leading: %+v", st)
	}
	// Which of the campaign's statements times out first depends on the
	// machine's pace (its read of the lease, its acquisition): either is
	// logged at Warn as retried.
	if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "failed; retrying") || !strings.Contains(l, "57014") {
		t.Errorf("no Warn about the retried campaign; log:\n%s", l)
	}
}
