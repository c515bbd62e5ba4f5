package httplock_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/httplock"
	"github.com/pglocks/pglocks/pgtest"
)

// Writes to one order are serialized across every instance of a service;
// reads are not locked.
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
	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(ctx)

	mw, err := httplock.New(httplock.Config{
		Source: httplock.Advisory(locker),
		Lock: func(r *http.Request) (string, bool) {
			return "order:" + r.PathValue("id"), r.Method != http.MethodGet
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/orders/{id}", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "done")
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// Another instance is changing order 42.
	other, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer other.Close(ctx)
	lk, err := other.Lock(ctx, pglocks.KeyOf("order:42"))
	if err != nil {
		log.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders/42", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, "Retry-After:", resp.Header.Get("Retry-After"))
	_ = lk.Unlock(ctx)

	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode)
	// Output:
	// 429 Retry-After: 1
	// 200
}
