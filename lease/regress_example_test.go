package lease_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// A failover to an asynchronous standby that lacked the last commits winds
// the fencing counter back; here an UPDATE does the same. The store that
// saw the higher tokens refuses the reissued one, and raises the counter.
func ExampleRegressionError() {
	ctx := context.Background()
	pool, done := examplePool()
	defer done()
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close(ctx)
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	for range 3 { // tokens 1, 2, 3
		l, err := store.TryAcquire(ctx, "billing", time.Minute)
		if err != nil {
			log.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			log.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, "update pglocks_leases set token = 1 where name = 'billing'"); err != nil {
		log.Fatal(err)
	}

	_, err = store.TryAcquire(ctx, "billing", time.Minute)
	var re *lease.RegressionError
	if errors.As(err, &re) {
		fmt.Printf("refused token %d: token %d was seen\n", re.Token, re.Seen)
	}
	l, err := store.TryAcquire(ctx, "billing", time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("next token", l.Token())
	// Output:
	// refused token 2: token 3 was seen
	// next token 4
}
