// Command httplock shows net/http middleware that serializes writes per
// resource across every instance of a service: a PUT takes the advisory lock
// "doc:<id>" with TryLock (through package httplock), and while another request holds it the answer is
// 429 Too Many Requests with a Retry-After header. The lock is released once
// the handler has written its response.
//
//	go run ./examples/httplock
//
// Two instances (two httptest servers, each with its own pool and
// [advisory.Locker], as two processes would have) receive concurrent PUTs.
// It runs on a throwaway PostgreSQL; with -dsn URL it runs on that
// database, where advisory locks leave nothing behind (its schema of its
// own stays empty and is dropped at the end).
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/examples/internal/exampledb"
	"github.com/pglocks/pglocks/httplock"
)

// retryAfter is what a busy resource tells clients to wait.
const retryAfter = time.Second

func main() { exampledb.Main(run) }

// serialize lets one request at a time through next per resource, named by
// the request's {id} path value, across all instances that share the
// database: package httplock's middleware on advisory locks. A request for
// a busy resource gets 429 with Retry-After.
func serialize(locker *advisory.Locker, kind string, next http.Handler) (http.Handler, error) {
	mw, err := httplock.New(httplock.Config{
		Source:     httplock.Advisory(locker),
		Lock:       func(r *http.Request) (string, bool) { return kind + ":" + r.PathValue("id"), true },
		RetryAfter: retryAfter,
	})
	if err != nil {
		return nil, err
	}
	return mw(next), nil
}

// instance is one instance of the service.
type instance struct {
	name   string
	srv    *httptest.Server
	locker *advisory.Locker
	pool   *pgxpool.Pool
}

// newInstance starts an instance whose PUT /docs/{id} handler writes the
// document slowly: it finishes only once slow is closed, so that concurrent
// requests find the lock held.
func newInstance(ctx context.Context, name, dsn string, slow <-chan struct{}) (*instance, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, err
	}
	locker, err := advisory.New(pool, advisory.Config{ApplicationName: "httplock-" + name})
	if err != nil {
		pool.Close()
		return nil, err
	}
	put := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-slow: // ... writing the document ...
		case <-r.Context().Done():
			return
		}
		fmt.Fprintf(w, "saved doc %s\n", r.PathValue("id"))
	})
	h, err := serialize(locker, "doc", put)
	if err != nil {
		_ = locker.Close(ctx)
		pool.Close()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("PUT /docs/{id}", h)
	return &instance{name: name, srv: httptest.NewServer(mux), locker: locker, pool: pool}, nil
}

func (in *instance) close(ctx context.Context) {
	in.srv.Close()
	_ = in.locker.Close(ctx)
	in.pool.Close()
}

// reply is the response to one request.
type reply struct {
	Instance, Path string
	Status         int
	RetryAfter     string
	Err            error
}

func (r reply) String() string {
	s := fmt.Sprintf("%s PUT %s → %d %s", r.Instance, r.Path, r.Status, http.StatusText(r.Status))
	if r.Err != nil {
		s = fmt.Sprintf("%s PUT %s → %v", r.Instance, r.Path, r.Err)
	}
	if r.RetryAfter != "" {
		s += ", Retry-After: " + r.RetryAfter
	}
	return s
}

func put(ctx context.Context, in *instance, path string) reply {
	rep := reply{Instance: in.name, Path: path}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, in.srv.URL+path, nil)
	if err != nil {
		rep.Err = err
		return rep
	}
	resp, err := in.srv.Client().Do(req)
	if err != nil {
		rep.Err = err
		return rep
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	rep.Status, rep.RetryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
	return rep
}

// outcome is what run saw.
type outcome struct {
	// Concurrent holds the replies to the concurrent PUTs; Again the reply
	// to the PUT sent after they finished.
	Concurrent []reply
	Again      reply
}

// run fires concurrent PUTs at two instances: four for doc 7, one for doc 8.
func run(ctx context.Context, db exampledb.Target, out io.Writer) (res outcome, err error) {
	slow := make(chan struct{})
	var instances []*instance
	defer func() {
		for _, in := range instances {
			in.close(context.WithoutCancel(ctx))
		}
	}()
	for _, name := range []string{"A", "B"} {
		in, err := newInstance(ctx, name, db.DSN, slow)
		if err != nil {
			return res, err
		}
		instances = append(instances, in)
	}

	paths := []string{"/docs/7", "/docs/7", "/docs/7", "/docs/7", "/docs/8"}
	fmt.Fprintf(out, "PUT /docs/7 ×4 and PUT /docs/8, at once, across instances A and B:\n")
	replies := make(chan reply)
	for i, path := range paths {
		go func() { replies <- put(ctx, instances[i%2], path) }()
	}
	// Three PUTs of doc 7 must be turned away while the fourth holds its
	// lock (and the PUT of doc 8 holds its own); then let the writes finish.
	for range paths {
		rep := <-replies
		res.Concurrent = append(res.Concurrent, rep)
		fmt.Fprintf(out, "  %v\n", rep)
		if len(res.Concurrent) == 3 {
			close(slow)
		}
	}

	res.Again = put(ctx, instances[1], "/docs/7")
	fmt.Fprintf(out, "after they finished: %v\n", res.Again)
	return res, nil
}
