package httplock_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/httplock"
	"github.com/pglocks/pglocks/pgtest"
)

// TestBusyGets429 runs two instances on two pools: while a PUT of doc 7
// runs on A, a PUT of doc 7 on B gets 429 with Retry-After and a
// problem+json body; a PUT of doc 8 and a GET go through; after A's
// handler returned, B's PUT succeeds.
func TestBusyGets429(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	release := make(chan struct{})
	h := func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") == "7" && r.Method == http.MethodPut {
			<-release
		}
	}
	a := newInstance(t, db.DSN, advisorySource, httplock.Config{}, h)
	b := newInstance(t, db.DSN, advisorySource, httplock.Config{RetryAfter: 1500 * time.Millisecond}, func(http.ResponseWriter, *http.Request) {})
	ctx := ctxT(t)
	first := make(chan response, 1)
	go func() { first <- do(ctx, http.MethodPut, a.url+"/docs/7") }()
	waitEntered(t, a)

	r := do(ctx, http.MethodPut, b.url+"/docs/7")
	if r.err != nil || r.status != http.StatusTooManyRequests || r.retryAfter != "2" {
		t.Errorf("busy PUT on B = %d, Retry-After %q (%v); want 429, \"2\" (1.5s rounded up)", r.status, r.retryAfter, r.err)
	}
	if r.ctype != "application/problem+json" || r.problem["status"] != float64(429) || r.problem["title"] != "Too Many Requests" {
		t.Errorf("busy body: %s %v", r.ctype, r.problem)
	}
	for _, req := range []struct{ method, path string }{{http.MethodPut, "/docs/8"}, {http.MethodGet, "/docs/7"}} {
		if r := do(ctx, req.method, b.url+req.path); r.status != http.StatusOK {
			t.Errorf("%s %s on B = %d (%v), want 200", req.method, req.path, r.status, r.err)
		}
	}
	close(release)
	if r := <-first; r.status != http.StatusOK {
		t.Fatalf("A's PUT = %d (%v)", r.status, r.err)
	}
	if r := do(ctx, http.MethodPut, b.url+"/docs/7"); r.status != http.StatusOK {
		t.Errorf("PUT on B after A's returned = %d (%v), want 200: the lock was not released", r.status, r.err)
	}
}

// TestReleaseOnPanic: a handler that panics still releases its lock.
func TestReleaseOnPanic(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	a := newInstance(t, db.DSN, advisorySource, httplock.Config{}, func(http.ResponseWriter, *http.Request) { panic("boom") })
	ctx := ctxT(t)
	if r := do(ctx, http.MethodPut, a.url+"/docs/9"); r.err == nil {
		t.Fatalf("a panicking handler answered %d; net/http should abort the response", r.status)
	}
	// The panic unwound through the middleware, which released the lock:
	// another locker can take it at once.
	b := newInstance(t, db.DSN, advisorySource, httplock.Config{}, func(http.ResponseWriter, *http.Request) {})
	lk, err := b.locker.TryLock(ctx, pglocks.KeyOf("doc:9"))
	if err != nil {
		t.Fatalf("TryLock after the panic: %v; want the lock released", err)
	}
	_ = lk.Unlock(ctx)
}

// TestMaxWait: with MaxWait a request waits for the lock instead of a 429.
func TestMaxWait(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	release := make(chan struct{})
	a := newInstance(t, db.DSN, advisorySource, httplock.Config{}, func(http.ResponseWriter, *http.Request) { <-release })
	b := newInstance(t, db.DSN, advisorySource, httplock.Config{MaxWait: 30 * time.Second}, func(http.ResponseWriter, *http.Request) {})
	ctx := ctxT(t)
	first := make(chan response, 1)
	go func() { first <- do(ctx, http.MethodPut, a.url+"/docs/1") }()
	waitEntered(t, a)
	second := make(chan response, 1)
	go func() { second <- do(ctx, http.MethodPut, b.url+"/docs/1") }()
	close(release)
	if r := <-first; r.status != http.StatusOK {
		t.Fatalf("first PUT = %d (%v)", r.status, r.err)
	}
	t0 := time.Now()
	if r := <-second; r.status != http.StatusOK {
		t.Fatalf("waiting PUT = %d (%v), want 200", r.status, r.err)
	}
	t.Logf("waiting PUT answered %v after the first", time.Since(t0))
	// A short wait that runs out is a 429.
	c := newInstance(t, db.DSN, advisorySource, httplock.Config{MaxWait: 50 * time.Millisecond}, func(http.ResponseWriter, *http.Request) {})
	lk, err := c.locker.TryLock(ctx, pglocks.KeyOf("doc:2"))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(ctx)
	if r := do(ctx, http.MethodPut, c.url+"/docs/2"); r.status != http.StatusTooManyRequests {
		t.Fatalf("PUT after a wait that ran out = %d (%v), want 429", r.status, r.err)
	}
}

// TestLeaseRetryAfter: with leases, Retry-After is the holder's time left.
func TestLeaseRetryAfter(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	leaseSource := func(in *instance) httplock.Source { return httplock.Lease(in.store, 20*time.Second) }
	release := make(chan struct{})
	a := newInstance(t, db.DSN, leaseSource, httplock.Config{}, func(http.ResponseWriter, *http.Request) { <-release })
	ctx := ctxT(t)
	if err := a.store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b := newInstance(t, db.DSN, leaseSource, httplock.Config{}, func(http.ResponseWriter, *http.Request) {})
	first := make(chan response, 1)
	go func() { first <- do(ctx, http.MethodPut, a.url+"/docs/3") }()
	waitEntered(t, a)
	r := do(ctx, http.MethodPut, b.url+"/docs/3")
	if n, _ := strconv.Atoi(r.retryAfter); r.status != http.StatusTooManyRequests || n < 15 || n > 20 {
		t.Errorf("busy PUT = %d, Retry-After %q; want 429 and the holder's time left (about 20)", r.status, r.retryAfter)
	}
	close(release)
	if r := <-first; r.status != http.StatusOK {
		t.Fatalf("first PUT = %d (%v)", r.status, r.err)
	}
	if r := do(ctx, http.MethodPut, b.url+"/docs/3"); r.status != http.StatusOK {
		t.Errorf("PUT after release = %d, want 200", r.status)
	}
}

// TestErrors: a failing Source gets 503 problem+json; bad configs are
// refused with the field named.
func TestErrors(t *testing.T) {
	t.Parallel()
	for _, cfg := range []httplock.Config{{}, {Source: failing{}}, {Source: failing{}, Lock: always, MaxWait: -1}} {
		if _, err := httplock.New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
	mw, err := httplock.New(httplock.Config{Source: failing{}, Lock: always})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	mw(http.NotFoundHandler()).ServeHTTP(rec, newRequest())
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Errorf("failing Source: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
}

type failing struct{}

func (failing) Acquire(context.Context, string, bool) (httplock.Held, error) {
	return nil, errors.New("database down")
}

func always(*http.Request) (string, bool) { return "x", true }
