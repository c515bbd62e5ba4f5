package lease_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/logtest"
	"github.com/pglocks/pglocks/lease"
)

// eventually waits until cond holds, checking every millisecond, or fails
// the test after d.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(d)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s: not within %v", what, d)
		}
	}
}

func TestKeepAliveRenews(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	// A TTL of a second: renewed at a third of it, the lease survives a
	// machine loaded enough to delay a renewal by half a second.
	l := mustTry(t, b.store, "ka", time.Second, lease.WithKeepAlive())
	first := l.ExpiresAt()
	// Outlive the first TTL three times over, renewed all along.
	eventually(t, 30*time.Second, "three TTLs of renewals", func() bool {
		return l.ExpiresAt().Sub(first) > 3*time.Second || l.Err() != nil
	})
	if err := l.Err(); err != nil {
		t.Fatalf("lease ended: %v", err)
	}
	if err := l.Assert(ctx, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestKeepAliveDetectsTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	// TTL 3 s: the loss must come from the renewal that finds the row
	// broken, not from a trust deadline a loaded machine let pass first.
	l := mustTry(t, b.store, "ka", 3*time.Second, lease.WithKeepAlive())
	if _, err := b.store.Break(ctx, "ka"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, l.Lost(), 10*time.Second, "loss after Break")
	if !errors.Is(l.Err(), lease.ErrNotHeld) || !errors.Is(context.Cause(l.Context()), lease.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost from ErrNotHeld", l.Err())
	}
	if err := l.Release(ctx); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("release after loss: %v, want ErrNotHeld", err)
	}
}

// TestTrustDeadline: without renewals a lease stops being trusted at send
// time + TTL − margin, before the server lets anyone else have it.
func TestTrustDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	sent := time.Now()
	l := mustTry(t, b.store, "trust", 200*time.Millisecond)
	waitFor(t, l.Lost(), 2*time.Second, "loss at the trust deadline")
	lostAt := time.Now()
	// The trust deadline comes before the server's expiry (one machine, so
	// one wall clock): it starts at the statement's send time, which is
	// after this test's "sent" (the pool's acquire comes first) but before
	// the server computed the expiry.
	if lostAt.Before(l.TrustedUntil()) || !l.TrustedUntil().Before(l.ExpiresAt()) {
		t.Fatalf("lost at +%v, trusted until +%v, server expiry +%v",
			lostAt.Sub(sent), l.TrustedUntil().Sub(sent), l.ExpiresAt().Sub(sent))
	}
	// The server may still hold it for this owner: nobody else has it yet,
	// or has only just got it.
	if !errors.Is(l.Err(), lease.ErrLost) {
		t.Fatalf("Err = %v", l.Err())
	}
	_ = ctx
}

// TestClockSkew: a local clock hours off changes nothing, since expiry is
// judged by the server and local deadlines only measure durations.
func TestClockSkew(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{-5 * time.Hour, 7 * time.Hour} {
		t.Run(skew.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := ctxT(t)
			s := newStore(t, b.pool, lease.Config{Now: func() time.Time { return time.Now().Add(skew) }})
			before := time.Now().Add(skew)
			// TTL 3 s, renewed every second: with 900 ms the keep-alive
			// missed its 810 ms of trust in the whole -race suite beside two
			// busy loops.
			l := mustTry(t, s, "skew", 3*time.Second, lease.WithKeepAlive())
			after := time.Now().Add(skew)
			// Trusted until the send time (in the skewed clock) + 2.7 s.
			if tu := l.TrustedUntil(); tu.Before(before.Add(2700*time.Millisecond)) || tu.After(after.Add(2700*time.Millisecond)) {
				t.Fatalf("trusted until %v after the call began, want 2.7s after the send", tu.Sub(before))
			}
			if _, err := s.TryAcquire(ctx, "skew", time.Minute); !errors.Is(err, lease.ErrHeld) {
				t.Fatalf("second try: %v, want ErrHeld", err)
			}
			first := l.ExpiresAt()
			eventually(t, 15*time.Second, "two renewals", func() bool { return l.ExpiresAt().Sub(first) > 1500*time.Millisecond || l.Err() != nil })
			if err := l.Err(); err != nil {
				t.Fatalf("lost: %v", err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			short := mustTry(t, s, "skew", 100*time.Millisecond)
			start := time.Now()
			waitFor(t, short.Lost(), 2*time.Second, "trust deadline")
			if el := time.Since(start); el > 2*time.Second || time.Now().Add(skew).Before(short.TrustedUntil()) {
				t.Fatalf("trust deadline fired after %v, want about 90ms", el)
			}
		})
	}
}

// TestKeepAliveSurvivesKilledConnections: renewals that fail because the
// pool's connections were terminated are retried while time remains.
func TestKeepAliveSurvivesKilledConnections(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	app := "lease_ka_" + time.Now().Format("150405.000000")
	pool := b.db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = app })
	rec, log := logtest.New()
	s := newStore(t, pool, lease.Config{Logger: log})
	// A TTL that leaves a loaded machine time to dial again: with 600 ms
	// (trust 540 ms, a renewal due every 200 ms) a fresh-clone CI run under
	// a CPU hog lost the lease once, redialling after the kill, and with
	// 3 s the whole suite did beside two busy loops.
	l := mustTry(t, s, "ka", 6*time.Second, lease.WithKeepAlive())
	lost := func() {
		t.Helper()
		for _, r := range rec.Records() {
			t.Log(r)
		}
		t.Fatalf("lost: %v", l.Err())
	}
	for range 3 {
		if _, err := b.db.Server.TerminateApplication(ctx, app); err != nil {
			t.Fatal(err)
		}
		exp := l.ExpiresAt()
		eventually(t, 15*time.Second, "a renewal after the kill", func() bool { return l.ExpiresAt().After(exp) || l.Err() != nil })
		if l.Err() != nil {
			lost()
		}
	}
	if l.Err() != nil {
		lost()
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReleaseRacesKeepAlive: releases and explicit renewals racing a
// keep-alive that renews every 200 µs leave no row owned and produce no
// error but the honest ErrNotHeld of a renewal that came after the release.
// The store's bound on the renewal interval is lowered for it: the public
// one (MinRenewInterval, 10ms) would make the races rare. Up to 2,000
// cycles, or as many as 40 s allow on a loaded machine (at least 200).
func TestReleaseRacesKeepAlive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := newStore(t, b.pool, lease.Config{RenewFraction: 0.002})
	lease.SetMinRenewInterval(s, 100*time.Microsecond)
	cycles, start := 2000, time.Now()
	lost := 0
	for i := range cycles {
		if i >= 200 && time.Since(start) > 40*time.Second {
			cycles = i
			break
		}
		l := mustTry(t, s, "race", lease.MinTTL, lease.WithKeepAlive())
		var wg sync.WaitGroup
		wg.Go(func() {
			if err := l.Renew(ctx); err != nil && !errors.Is(err, lease.ErrNotHeld) {
				t.Errorf("cycle %d: renew: %v", i, err)
			}
		})
		spin(time.Duration(rand.N(200)) * time.Microsecond)
		if err := l.Release(ctx); err != nil {
			// Honest only if the lease had really run out: no renewal
			// succeeded within its 90 ms of trust (a stalled scheduler).
			if !errors.Is(err, lease.ErrNotHeld) || time.Now().Before(l.TrustedUntil()) {
				t.Fatalf("cycle %d: release: %v (lease: %v)", i, err, l.Err())
			}
			lost++
		}
		wg.Wait()
	}
	var owned int
	if err := b.pool.QueryRow(ctx, "select count(*) from pglocks_leases where owner is not null and expires_at > now()", pgx.QueryExecModeExec).Scan(&owned); err != nil {
		t.Fatal(err)
	}
	if owned != 0 {
		t.Fatalf("%d rows still owned after %d release cycles", owned, cycles)
	}
	t.Logf("%d cycles, %d leases lost to scheduling delays before release", cycles, lost)
}

func TestDo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)

	t.Run("RunsAndReleases", func(t *testing.T) {
		ran := false
		err := b.store.Do(ctx, "do", time.Minute, func(ctx context.Context) error {
			ran = true
			held, err := b.store.IsHeld(ctx, "do")
			if err != nil || !held {
				t.Errorf("IsHeld inside Do = %v, %v", held, err)
			}
			return nil
		})
		if err != nil || !ran {
			t.Fatalf("Do = %v, ran %v", err, ran)
		}
		if held, _ := b.store.IsHeld(ctx, "do"); held {
			t.Fatal("still held after Do")
		}
	})

	t.Run("ReturnsFnError", func(t *testing.T) {
		boom := errors.New("boom")
		if err := b.store.Do(ctx, "do", time.Minute, func(context.Context) error { return boom }); !errors.Is(err, boom) {
			t.Fatalf("Do = %v, want boom", err)
		}
	})

	t.Run("CancelsFnOnLoss", func(t *testing.T) {
		err := b.store.Do(ctx, "do-lost", 300*time.Millisecond, func(fctx context.Context) error {
			if _, err := b.store.Break(ctx, "do-lost"); err != nil {
				return err
			}
			select {
			case <-fctx.Done():
				return context.Cause(fctx)
			case <-time.After(5 * time.Second):
				return errors.New("fn's context not cancelled after the lease was broken")
			}
		})
		if !errors.Is(err, lease.ErrLost) {
			t.Fatalf("Do = %v, want ErrLost", err)
		}
	})
}
