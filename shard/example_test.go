package shard_test

import (
	"context"
	"fmt"
	"log"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/shard"
)

// A replica joins the group "tenants" and works on the shards it comes to
// own, each with a context cancelled when the shard moves to another
// replica or is lost. Run every replica this way: each takes its share.
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
	// The Store's pool: give the shards' work a pool of its own, so that
	// its busy connections never delay the Store's reads, acquisitions and
	// renewals.
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

	m, err := shard.New(shard.Config{Group: "tenants", Shards: []string{"eu", "us", "asia"}, Store: store})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	var (
		mu    sync.Mutex
		owned []string
	)
	err = m.Run(runCtx, func(ctx context.Context, s shard.Shard) {
		// ... the shard's work, guarding its writes with s.Guard ...
		mu.Lock()
		defer mu.Unlock()
		if owned = append(owned, s.Name); len(owned) == 3 {
			stop() // this example stops once it owns every shard
		}
	})
	if err != nil {
		log.Fatal(err)
	}
	slices.Sort(owned)
	fmt.Println("owned", owned)
	// Output:
	// owned [asia eu us]
}
