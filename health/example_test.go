package health_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/health"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// A service mounts the elector's liveness check at /healthz and, where only
// the leader serves, its readiness check at /readyz.
func Example() {
	ctx := context.Background()
	dsn, err := pgtest.ExampleDSN(ctx) // a throwaway database; use your own
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close(ctx)
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	elected := make(chan struct{})
	e, err := leader.New(leader.Config{Name: "billing", Pool: pool, Store: store,
		OnElected: func(leader.Term) { close(elected) }})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close(ctx)

	mux := http.NewServeMux()
	mux.Handle("/healthz", health.Handler(e))
	mux.Handle("/readyz", health.Ready(e))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	probe := func(path string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(path, resp.StatusCode)
	}

	probe("/healthz") // Run not started yet
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		done <- e.Run(runCtx, func(ctx context.Context, _ leader.Term) error { <-ctx.Done(); return nil })
	}()
	<-elected
	probe("/healthz")
	probe("/readyz")
	stop()
	<-done
	// Output:
	// /healthz 503
	// /healthz 200
	// /readyz 200
}
