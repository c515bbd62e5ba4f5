package leader_test

import (
	"context"
	"fmt"
	"log"
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
