package httplock_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/httplock"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// TestLeaseReleaseDuringOutage: the handler returns
// while the server restarts — its sessions ended, new connections refused
// — so the middleware's release cannot be sent. Once the server is back
// the resource is free again: a request gets 200, not 429 for good (before
// the fix, the release's error was dropped and the lease's keep-alive
// went on renewing it until the Store closed).
func TestLeaseReleaseDuringOutage(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := ctxT(t)
	const app = "httplock-outage"
	ref := pgtest.NewRefuser(t)
	pool := db.NewPool(t, ref.Install, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = app })
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close(context.Background()) })
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	outage := true
	mw, err := httplock.New(httplock.Config{
		Source: httplock.Lease(store, 3*time.Second),
		Lock:   func(*http.Request) (string, bool) { return "doc:1", true },
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !outage {
			return
		}
		ref.Refuse()
		pool.Reset() // connections handed out before are closed when put back
		if _, err := db.TerminateApplication(r.Context(), app); err != nil {
			t.Error(err)
		}
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodPut, "/docs/1", nil))
	if rec.Code != http.StatusOK || ref.Refused() == 0 {
		t.Fatalf("first request = %d, %d dials refused: the outage did not meet the release", rec.Code, ref.Refused())
	}
	n := ref.Refused()
	waitUntil(t, "two more refused dials", func() bool { return ref.Refused() >= n+2 })
	ref.Allow()
	outage = false
	start := time.Now()
	deadline := start.Add(10 * time.Second)
	for {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodPut, "/docs/1", nil))
		if rec.Code == http.StatusOK {
			t.Logf("a request got 200 %v after the outage ended", time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			info, err := store.Get(ctx, "doc:1")
			t.Fatalf("10s after the outage a request still gets %d (Retry-After %s); row %+v (%v)",
				rec.Code, rec.Header().Get("Retry-After"), info, err)
		}
		time.Sleep(50 * time.Millisecond) // polling the answer, not synchronizing
	}
}

// waitUntil waits for cond, failing the test after 30 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within 30s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, not synchronizing
	}
}

// TestAdvisoryUnlockRefused: the server refuses the middleware's unlock
// (here EXECUTE on pg_advisory_unlock is revoked while the handler runs;
// an operator's pg_cancel_backend does the same), which leaves the lock
// held on its session. The middleware tries again within ReleaseTimeout,
// so once the server lets it the lock is freed and the resource is not
// answered 429 for as long as the session lives (before the fix, the error
// was dropped after one try).
func TestAdvisoryUnlockRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := ctxT(t)
	admin := db.NewPool(t)
	pool := db.NewPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.User, c.ConnConfig.Password = createRole(t, admin), "right"
	})
	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = locker.Close(context.Background()) })
	src := &counting{Source: httplock.Advisory(locker)}
	mw, err := httplock.New(httplock.Config{Source: src, Lock: func(*http.Request) (string, bool) { return "doc:1", true }})
	if err != nil {
		t.Fatal(err)
	}
	revoke := true
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		if revoke {
			exec(t, admin, "revoke execute on function pg_advisory_unlock(bigint) from public")
		}
	}))
	first := make(chan int, 1)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodPut, "/docs/1", nil))
		first <- rec.Code
	}()
	waitUntil(t, "a refused unlock", func() bool { return src.failed.Load() > 0 })
	exec(t, admin, "grant execute on function pg_advisory_unlock(bigint) to public")
	select {
	case code := <-first:
		if code != http.StatusOK {
			t.Fatalf("first request = %d", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the first request did not end within 30s")
	}
	revoke = false // the first request is over
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodPut, "/docs/1", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("after the unlock was allowed again a request gets %d: the lock is still held (%d releases failed)", rec.Code, src.failed.Load())
	}
}

// counting is a Source whose Helds count their failed releases.
type counting struct {
	httplock.Source
	failed atomic.Int64
}

func (c *counting) Acquire(ctx context.Context, name string, wait bool) (httplock.Held, error) {
	h, err := c.Source.Acquire(ctx, name, wait)
	if err != nil {
		return nil, err
	}
	return countingHeld{h, c}, nil
}

type countingHeld struct {
	httplock.Held
	c *counting
}

func (h countingHeld) Release(ctx context.Context) error {
	err := h.Held.Release(ctx)
	if err != nil {
		h.c.failed.Add(1)
	}
	return err
}

// createRole makes a login role (password "right") that is not a
// superuser, dropped when the test ends.
func createRole(t *testing.T, admin *pgxpool.Pool) string {
	t.Helper()
	role := fmt.Sprintf("httplock_%d", time.Now().UnixNano())
	exec(t, admin, "create role "+role+" login password 'right'")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(ctx, "select pg_terminate_backend(pid) from pg_stat_activity where usename = $1", role)
		_, _ = admin.Exec(ctx, "drop role "+role)
	})
	return role
}

// exec runs sql on pool, failing the test on error.
func exec(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}
