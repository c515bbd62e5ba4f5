package singleflight_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/singleflight"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pgtest.WrapMain(m))
}

// group returns a Group as one process would have it: its own pool and
// locker, results in the default table.
func group(t *testing.T, dsn string, ttl time.Duration) (*singleflight.Group, *singleflight.Table) {
	t.Helper()
	return groupWith(t, dsn, ttl, advisory.Config{})
}

// groupWith is group with the locker configured by cfg.
func groupWith(t *testing.T, dsn string, ttl time.Duration, cfg advisory.Config) (*singleflight.Group, *singleflight.Table) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	locker, err := advisory.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = locker.Close(context.Background()) })
	table, err := singleflight.NewTable(pool, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := table.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &singleflight.Group{Locker: locker, Results: table, TTL: ttl}, table
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestOnceAcrossProcesses: 3 processes × 4 concurrent calls for one key
// run fn once; every call gets its value.
func TestOnceAcrossProcesses(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := ctxT(t)
	var runs atomic.Int64
	release := make(chan struct{})
	fn := func(ctx context.Context) ([]byte, error) {
		runs.Add(1)
		<-release // hold the lock until every call has started
		return []byte("42"), nil
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	sources := map[singleflight.Source]int{}
	var started sync.WaitGroup
	for p := range 3 {
		g, _ := group(t, db.DSN, time.Minute)
		for range 4 {
			started.Add(1)
			wg.Go(func() {
				started.Done()
				v, from, err := g.Do(ctx, "report", fn)
				mu.Lock()
				defer mu.Unlock()
				if err != nil || string(v) != "42" {
					t.Errorf("process %d: Do = %q, %v", p, v, err)
				}
				sources[from]++
			})
		}
	}
	started.Wait()
	close(release)
	wg.Wait()
	if runs.Load() != 1 || sources[singleflight.Computed] != 1 || sources[singleflight.Waited]+sources[singleflight.Hit] != 11 {
		t.Errorf("fn ran %d times, sources %v; want once, 1 computed and 11 reused", runs.Load(), sources)
	}
}

// TestTTLAndErrors: an error is not stored; a result is reused until its
// TTL passes, then computed again; Purge removes expired rows.
func TestTTLAndErrors(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := ctxT(t)
	g, table := group(t, db.DSN, 200*time.Millisecond)
	var runs atomic.Int64
	fail := func(context.Context) ([]byte, error) { runs.Add(1); return nil, errors.New("upstream down") }
	ok := func(context.Context) ([]byte, error) { n := runs.Add(1); return fmt.Appendf(nil, "v%d", n), nil }
	if _, _, err := g.Do(ctx, "k", fail); err == nil || !strings.Contains(err.Error(), "upstream down") {
		t.Fatalf("Do with a failing fn = %v", err)
	}
	v, from, err := g.Do(ctx, "k", ok)
	if err != nil || string(v) != "v2" || from != singleflight.Computed {
		t.Fatalf("Do after an error = %q %v %v, want v2 computed (errors are not stored)", v, from, err)
	}
	if v, from, _ := g.Do(ctx, "k", ok); string(v) != "v2" || from != singleflight.Hit {
		t.Fatalf("Do again = %q %v, want v2 hit", v, from)
	}
	deadline := time.Now().Add(30 * time.Second)
	for { // until the stored result expires by the server clock
		if _, found, err := table.Get(ctx, "singleflight:k"); err != nil || !found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the result did not expire within 30s")
		}
		<-time.After(20 * time.Millisecond)
	}
	if v, from, _ := g.Do(ctx, "k", ok); string(v) != "v3" || from != singleflight.Computed {
		t.Fatalf("Do after the TTL = %q %v, want v3 computed", v, from)
	}
	g2 := *g
	g2.TTL = time.Microsecond
	if _, _, err := g2.Do(ctx, "short", ok); err != nil {
		t.Fatal(err)
	}
	if n, err := table.Purge(ctx); err != nil || n < 1 {
		t.Errorf("Purge = %d, %v; want at least the expired row", n, err)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fn := func(context.Context) ([]byte, error) { return nil, nil }
	var nilGroup *singleflight.Group
	for _, c := range []struct {
		g    *singleflight.Group
		want string
	}{
		{nilGroup, "nil *Group"}, {&singleflight.Group{}, "Locker is nil"},
		{&singleflight.Group{Locker: &advisory.Locker{}}, "Results is nil"},
		{&singleflight.Group{Locker: &advisory.Locker{}, Results: &singleflight.Table{}}, "TTL must be positive"},
	} {
		if _, _, err := c.g.Do(ctx, "k", fn); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Do = %v, want an error saying %q", err, c.want)
		}
	}
	if _, err := singleflight.NewTable(nil, "", ""); err == nil {
		t.Error("NewTable(nil pool) accepted")
	}
}

// TestPanicUnlocks: a panicking fn's panic goes on to Do's caller, and the
// key's lock is released first: the next call computes.
func TestPanicUnlocks(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := ctxT(t)
	g, _ := group(t, db.DSN, time.Minute)
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v, want fn's panic", r)
			}
		}()
		_, _, _ = g.Do(ctx, "k", func(context.Context) ([]byte, error) { panic("boom") })
	}()
	v, from, err := g.Do(ctx, "k", func(context.Context) ([]byte, error) { return []byte("v"), nil })
	if err != nil || from != singleflight.Computed || string(v) != "v" {
		t.Errorf("Do after a panic = %q, %v, %v; want v, computed", v, from, err)
	}
	if held, err := g.Locker.IsHeld(ctx, pglocks.KeyOf("singleflight:k")); err != nil || held {
		t.Errorf("key held after Do = %v, %v", held, err)
	}
}
