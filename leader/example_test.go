package leader_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// A replica campaigns for leadership of "scheduler" and runs the leader's
// work with a context that is cancelled when leadership is lost.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx) // a throwaway server; use your own DSN
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	db, err := srv.CreateDatabase(ctx)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, db.DSN)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close(context.Background())
	if err := store.Migrate(ctx); err != nil { // once, at deploy time
		log.Fatal(err)
	}

	e, err := leader.New(leader.Config{Name: "scheduler", Pool: pool, Store: store})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close(context.Background())

	runCtx, stop := context.WithCancel(ctx)
	err = e.Run(runCtx, func(ctx context.Context, term leader.Term) error {
		fmt.Println("leading, term", term.Number)
		// ... the leader's work, guarding its writes with term.Guard ...
		stop() // this example stops after one term; a service runs on
		<-ctx.Done()
		fmt.Println("stepped down:", context.Cause(ctx) != nil)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// leading, term 1
	// stepped down: true
}

// ExampleElector_HandOver hands the term over on a rolling deploy: with
// HandOverOnClose, the SIGTERM that ends Run's ctx hands the term to
// another live candidate instead of leaving the election to a race; a
// deploy script can also move it explicitly (pglocks leader handover).
func ExampleElector_HandOver() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return
	}
	defer pool.Close()
	e, err := leader.New(leader.Config{Name: "billing", Pool: pool, Value: "http://10.0.0.7:8080", HandOverOnClose: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close(ctx)
	// Elsewhere, while this candidate leads: move the term to "replica-2".
	if err := e.HandOver(ctx, "replica-2"); errors.Is(err, leader.ErrNoCandidate) || errors.Is(err, leader.ErrNotLeader) {
		fmt.Println("still as before:", err)
	}
}

// ExampleCandidates lists an election's running candidates from any
// process, with only a lease Store.
func ExampleCandidates() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return
	}
	defer pool.Close()
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		return
	}
	defer store.Close(ctx)
	cs, err := leader.Candidates(ctx, store, "billing")
	if err != nil {
		return
	}
	for _, c := range cs {
		fmt.Println(c.Identity, c.Value, c.Leading, c.LastSeen)
	}
}
