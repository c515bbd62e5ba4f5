package lease_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// Transfer between two accounts: take both accounts' leases, or neither.
func ExampleStore_TryAcquireAll() {
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

	busy, err := store.TryAcquire(ctx, "account:B", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	_, err = store.TryAcquireAll(ctx, []string{"account:A", "account:B"}, 30*time.Second)
	var held *lease.HeldAllError
	if errors.As(err, &held) {
		fmt.Println("held:", held.Held[0].Name, "- nothing taken")
	}
	if err := busy.Release(ctx); err != nil {
		log.Fatal(err)
	}

	ls, err := store.TryAcquireAll(ctx, []string{"account:A", "account:B"}, 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range ls {
		fmt.Println(l.Name(), "token", l.Token())
	}
	for _, l := range ls {
		if err := l.Release(ctx); err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// held: account:B - nothing taken
	// account:A token 1
	// account:B token 2
}

// At most 2 exports run at once, across every process using the table.
func Example_semaphore() {
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

	sem, err := store.Semaphore("exports", 2)
	if err != nil {
		log.Fatal(err)
	}
	a, err := sem.Acquire(ctx, 1, time.Minute, lease.WithKeepAlive())
	if err != nil {
		log.Fatal(err)
	}
	b, err := sem.Acquire(ctx, 1, time.Minute, lease.WithKeepAlive())
	if err != nil {
		log.Fatal(err)
	}
	_, err = sem.TryAcquire(ctx, 1, time.Minute)
	fmt.Println("third:", err)
	n, err := sem.Count(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("held:", n, "tokens:", a.Tokens(), b.Tokens())

	// The work runs under a.Context(), which ends if a permit is lost.
	if err := a.Release(ctx); err != nil {
		log.Fatal(err)
	}
	c, err := sem.TryAcquire(ctx, 1, time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("after a release:", c.Leases()[0].Name(), "token", c.Tokens()[0])
	_ = b.Release(ctx)
	_ = c.Release(ctx)
	// Output:
	// third: semaphore "exports": 2 of 2 permits held, 1 wanted
	// held: 2 tokens: [1] [1]
	// after a release: exports#0 token 2
}
