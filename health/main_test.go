package health_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pgtest.WrapMain(m))
}

// migrate creates the lease table in db.
func migrate(t *testing.T, db *pgtest.DB) {
	t.Helper()
	pool := db.NewPool(t)
	s, err := lease.New(pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// candidate is one elector on its own pool, with Run started by run.
type candidate struct {
	e    *leader.Elector
	done chan struct{} // closed when Run returned
	err  error         // what Run returned, once done is closed
	stop context.CancelFunc
}

func newCandidate(t *testing.T, pool *pgxpool.Pool, name string, cfg leader.Config) *candidate {
	t.Helper()
	cfg.Name, cfg.Pool = name, pool
	e, err := leader.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &candidate{e: e}
	t.Cleanup(func() {
		if c.stop != nil {
			c.stop()
			<-c.done
		}
		_ = e.Close(context.Background())
	})
	return c
}

// run starts Run; the leader's work waits for its context.
func (c *candidate) run() {
	ctx, stop := context.WithCancel(context.Background())
	c.stop, c.done = stop, make(chan struct{})
	go func() {
		defer close(c.done)
		c.err = c.e.Run(ctx, func(ctx context.Context, _ leader.Term) error {
			<-ctx.Done()
			return nil
		})
	}()
}

// get returns the status and body of a GET of url.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitState waits up to d for cond on c's state.
func waitState(t *testing.T, c *candidate, d time.Duration, what string, cond func(leader.State) bool) leader.State {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		st := c.e.State()
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v (state %+v)", what, d, st)
		}
		select {
		case <-time.After(5 * time.Millisecond): // polling State is the point
		case <-c.done:
			t.Fatalf("%s: Run returned", what)
		}
	}
}

func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// poolOn returns a pool on dsn, closed when the test ends.
func poolOn(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
