package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
)

// Moving money between two accounts locks both, all or none, in one round
// trip: two transfers in opposite directions never deadlock, and a busy
// account makes TryLockAll fail with nothing held.
func ExampleLocker_TryLockAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, cleanup := examplePool(ctx)
	defer cleanup()

	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(context.Background())

	from, to := pglocks.KeyOf("account:17"), pglocks.KeyOf("account:42")
	locks, err := locker.TryLockAll(ctx, from, to)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("holding", len(locks.Keys()), "accounts")

	// The reverse transfer finds an account busy and holds nothing.
	_, err = locker.TryLockAll(ctx, to, from)
	fmt.Println("reverse transfer busy:", errors.Is(err, advisory.ErrLocked))

	if err := locks.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// holding 2 accounts
	// reverse transfer busy: true
}

// At most 2 exports run at once across every replica: each holds a permit
// of the semaphore "exports" while it runs, and a crashed replica's permit
// is free at once (it dies with the session).
func ExampleSemaphore() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, cleanup := examplePool(ctx)
	defer cleanup()

	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(context.Background())

	sem, err := locker.Semaphore("exports", 2)
	if err != nil {
		log.Fatal(err)
	}
	a, err := sem.Acquire(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	b, err := sem.Acquire(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	n, _ := sem.Count(ctx) // from pg_locks: every replica's permits
	fmt.Println("permits held:", n)

	_, err = sem.TryAcquire(ctx, 1)
	fmt.Println("third export busy:", errors.Is(err, advisory.ErrLocked))

	// Work under a permit stops if the permit is lost.
	select {
	case <-a.Context().Done():
	default:
		fmt.Println("exporting")
	}
	_ = a.Release(ctx)
	_ = b.Release(ctx)
	// Output:
	// permits held: 2
	// third export busy: true
	// exporting
}
