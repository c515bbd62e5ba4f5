package lease_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/pglocks/pglocks/lease"
)

func ExampleStore_TryAcquireShared() {
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

	// Two readers of the catalog at once.
	r1, err := store.TryAcquireShared(ctx, "catalog", 30*time.Second, lease.WithKeepAlive())
	if err != nil {
		log.Fatal(err)
	}
	r2, err := store.TryAcquireShared(ctx, "catalog", 30*time.Second, lease.WithKeepAlive())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("two readers in")

	// A writer is refused while they read.
	_, err = store.TryAcquireExclusive(ctx, "catalog", 30*time.Second)
	fmt.Println("writer refused:", errors.Is(err, lease.ErrHeld))

	r1.Release(ctx)
	r2.Release(ctx)
	w, err := store.TryAcquireExclusive(ctx, "catalog", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer w.Release(ctx)
	fmt.Println("writer in, fencing token", w.Token())

	// Now readers are refused.
	_, err = store.TryAcquireShared(ctx, "catalog", 30*time.Second)
	var held *lease.HeldError
	fmt.Println("reader refused by", errors.As(err, &held) && held.Name == "catalog#w")
	// Output:
	// two readers in
	// writer refused: true
	// writer in, fencing token 1
	// reader refused by true
}

func ExampleStore_AcquireExclusive() {
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

	r, err := store.TryAcquireShared(ctx, "schema", 30*time.Second, lease.WithKeepAlive())
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		// The reader finishes its work; its release wakes the writer.
		<-time.After(100 * time.Millisecond)
		r.Release(ctx)
	}()
	// The writer keeps new readers out from now on, and waits only for
	// the reader already in.
	w, err := store.AcquireExclusive(ctx, "schema", 30*time.Second, lease.WithKeepAlive())
	if err != nil {
		log.Fatal(err)
	}
	defer w.Release(ctx)
	fmt.Println("writer in, fencing token", w.Token())
	// Output:
	// writer in, fencing token 1
}

func ExampleWithMaxHold() {
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

	// A job that hangs loses the name after a minute at most, however long
	// its keep-alive would renew it.
	err = store.Do(ctx, "job:import", 30*time.Second, func(ctx context.Context) error {
		<-ctx.Done() // a wedged job, stopped by the max hold
		return ctx.Err()
	}, lease.WithMaxHold(200*time.Millisecond))
	fmt.Println("max hold reached:", errors.Is(err, lease.ErrMaxHold))

	held, err := store.IsHeld(ctx, "job:import")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("still held:", held)
	// Output:
	// max hold reached: true
	// still held: false
}
