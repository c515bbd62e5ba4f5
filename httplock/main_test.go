package httplock_test

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/httplock"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pgtest.WrapMain(m))
}

// instance is one instance of a service: its own pool, locker, store and
// HTTP server, whose handler for /docs/{id} blocks until release is closed.
type instance struct {
	url     string
	locker  *advisory.Locker
	store   *lease.Store
	entered chan string // the handler's path, when it starts
}

type handlerFunc = func(w http.ResponseWriter, r *http.Request)

func newInstance(t *testing.T, dsn string, source func(*instance) httplock.Source, cfg httplock.Config, h handlerFunc) *instance {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	in := &instance{entered: make(chan string, 10)}
	if in.locker, err = advisory.New(pool, advisory.Config{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.locker.Close(context.Background()) })
	if in.store, err = lease.New(pool, lease.Config{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.store.Close(context.Background()) })
	cfg.Source = source(in)
	cfg.Lock = func(r *http.Request) (string, bool) {
		return "doc:" + r.PathValue("id"), r.Method == http.MethodPut
	}
	mw, err := httplock.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/docs/{id}", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in.entered <- r.URL.Path
		h(w, r)
	})))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panic test's panic
	srv.Start()
	t.Cleanup(srv.Close)
	in.url = srv.URL
	return in
}

func advisorySource(in *instance) httplock.Source { return httplock.Advisory(in.locker) }

// response is what a client saw.
type response struct {
	status     int
	retryAfter string
	ctype      string
	problem    map[string]any
	err        error
}

func do(ctx context.Context, method, url string) response {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return response{err: err}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{err: err}
	}
	defer resp.Body.Close()
	r := response{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), ctype: resp.Header.Get("Content-Type")}
	if r.ctype == "application/problem+json" {
		_ = json.NewDecoder(resp.Body).Decode(&r.problem)
	}
	return r
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func waitEntered(t *testing.T, in *instance) {
	t.Helper()
	select {
	case <-in.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not start within 30s")
	}
}

func newRecorder() *httptest.ResponseRecorder { return httptest.NewRecorder() }

func newRequest() *http.Request { return httptest.NewRequest(http.MethodPut, "/x", nil) }
