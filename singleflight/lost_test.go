package singleflight_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/singleflight"
)

// slowPing is a Locker that checks its idle sessions only once a minute:
// it does not notice a terminated session before the fenced store runs, so
// only the store's own check stands between a lost lock and a stored
// result.
var slowPing = advisory.Config{PingInterval: time.Minute, KeepalivesIdle: 2 * time.Minute, TCPUserTimeout: 3 * time.Minute}

// recv waits for a value on ch, failing the test after a generous deadline.
func recv[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// closed waits until ch is closed, failing the test after a deadline.
func closed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	recv(t, what, ch)
}

type doResult struct {
	value []byte
	from  singleflight.Source
	err   error
}

// TestLostLockNotStored: A's fn runs; A's lock
// session is terminated; B's Do takes the key and runs fn; A's fn returns
// after B's has started. A's result must not be stored and A's Do must
// say the lock was lost; B's result, computed under a lock held
// throughout, is stored.
func TestLostLockNotStored(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		cfg  advisory.Config
	}{{"DefaultPing", advisory.Config{}}, {"SlowPing", slowPing}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testLostLockNotStored(t, c.cfg)
		})
	}
}

func testLostLockNotStored(t *testing.T, cfgA advisory.Config) {
	db := pgtest.New(t)
	ctx := ctxT(t)
	gA, table := groupWith(t, db.DSN, time.Minute, cfgA)
	gB, _ := group(t, db.DSN, time.Minute)
	var runs atomic.Int64
	aStarted, bStarted, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	fnA := func(context.Context) ([]byte, error) {
		runs.Add(1)
		close(aStarted)
		// Keeps computing whatever its ctx says, as a slow fn would.
		select {
		case <-bStarted:
			return []byte("A's result"), nil
		case <-time.After(time.Minute):
			return nil, errors.New("B's fn never started")
		}
	}
	fnB := func(context.Context) ([]byte, error) {
		runs.Add(1)
		close(bStarted)
		select {
		case <-release:
			return []byte("B's result"), nil
		case <-time.After(time.Minute):
			return nil, errors.New("never released")
		}
	}
	aDone, bDone := make(chan doResult, 1), make(chan doResult, 1)
	go func() { v, from, err := gA.Do(ctx, "lost-lock", fnA); aDone <- doResult{v, from, err} }()
	closed(t, "A's fn to start", aStarted)

	holders, err := advisory.Holders(ctx, db.NewPool(t), pglocks.KeyOf("singleflight:lost-lock"))
	if err != nil || len(holders) != 1 || !holders[0].Granted {
		t.Fatalf("holders of A's key = %+v, %v; want A's session alone", holders, err)
	}
	if err := db.Server.TerminateBackend(ctx, holders[0].PID); err != nil {
		t.Fatal(err)
	}
	go func() { v, from, err := gB.Do(ctx, "lost-lock", fnB); bDone <- doResult{v, from, err} }()
	closed(t, "B's fn to start", bStarted)

	a := recv(t, "A's Do", aDone)
	t.Logf("A's Do: %q, %v, %v", a.value, a.from, a.err)
	if a.err == nil || !errors.Is(a.err, advisory.ErrLost) || !strings.Contains(a.err.Error(), "not stored") {
		t.Errorf("A's Do = %q, %v, %v; want an error wrapping advisory.ErrLost that says the result was not stored", a.value, a.from, a.err)
	}
	if v, found, err := table.Get(ctx, "singleflight:lost-lock"); err != nil || found {
		t.Errorf("stored while B computes = %q (found %v, err %v); want nothing: A's lock was lost while its fn ran", v, found, err)
	}
	close(release)
	b := recv(t, "B's Do", bDone)
	if b.err != nil || string(b.value) != "B's result" || b.from != singleflight.Computed {
		t.Errorf("B's Do = %q, %v, %v; want B's result, computed", b.value, b.from, b.err)
	}
	if v, found, err := table.Get(ctx, "singleflight:lost-lock"); err != nil || !found || string(v) != "B's result" {
		t.Errorf("stored at the end = %q (found %v, err %v); want B's result", v, found, err)
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("fn ran %d times, want 2 (A's, lost, and B's)", n)
	}
}
