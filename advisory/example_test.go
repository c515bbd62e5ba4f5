package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// examplePool starts a throwaway server (or uses PGTEST_DSN) and returns a
// pool on a fresh database, and a function that removes it all.
func examplePool(ctx context.Context) (*pgxpool.Pool, func()) {
	srv, err := pgtest.Start(ctx)
	if err != nil {
		log.Fatal(err)
	}
	db, err := srv.CreateDatabase(ctx)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, db.DSN)
	if err != nil {
		log.Fatal(err)
	}
	return pool, func() {
		pool.Close()
		_ = db.Drop(context.Background())
		_ = srv.Close()
	}
}

// Only one replica runs the nightly report; the others wait, and take over
// at once if the holder dies. fn's ctx is cancelled if the lock is lost.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, cleanup := examplePool(ctx)
	defer cleanup()

	locker, err := advisory.New(pool, advisory.Config{ApplicationName: "report-worker"})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(context.Background())

	err = locker.Do(ctx, pglocks.KeyOf("report:nightly"), func(ctx context.Context) error {
		fmt.Println("running the nightly report")
		return nil // long work here, stopping when ctx is cancelled
	})
	if errors.Is(err, advisory.ErrLost) {
		fmt.Println("lost the lock while running; the report may be incomplete")
	} else if err != nil {
		log.Fatal(err)
	}
	// Output: running the nightly report
}

// An HTTP handler that serializes writes to one resource answers "busy"
// instead of queueing: TryLock reports a held key with ErrLocked, never
// confused with a database error.
func ExampleLocker_TryLock() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, cleanup := examplePool(ctx)
	defer cleanup()
	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(context.Background())

	key := pglocks.KeyOf("invoice:42")
	first, err := locker.TryLock(ctx, key)
	if err != nil {
		log.Fatal(err)
	}
	_, err = locker.TryLock(ctx, key)
	switch {
	case errors.Is(err, advisory.ErrLocked):
		fmt.Println("429 Too Many Requests: invoice 42 is being written")
	case err != nil:
		log.Fatal(err)
	}
	if err := first.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: 429 Too Many Requests: invoice 42 is being written
}

// A held lock announces its loss, here because an operator terminated the
// holding session.
func ExampleLock_Lost() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, cleanup := examplePool(ctx)
	defer cleanup()
	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(context.Background())

	lk, err := locker.Lock(ctx, pglocks.KeyOf("leader"))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "select pg_terminate_backend($1)", int32(lk.PID())); err != nil {
		log.Fatal(err)
	}
	select {
	case <-lk.Lost():
		fmt.Println("lost:", errors.Is(lk.Err(), advisory.ErrLost))
	case <-ctx.Done():
		log.Fatal("no loss announced")
	}
	// Output: lost: true
}

// Behind PgBouncer in transaction mode, take transaction locks: they end
// with the transaction, so no session outlives its holder.
func ExampleXactLock() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, cleanup := examplePool(ctx)
	defer cleanup()

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := advisory.XactLock(ctx, tx, pglocks.KeyOf("queue:item:7")); err != nil {
			return err
		}
		held, err := advisory.IsHeld(ctx, tx, pglocks.KeyOf("queue:item:7"))
		fmt.Println("held inside the transaction:", held)
		return err // commit releases the lock
	})
	if err != nil {
		log.Fatal(err)
	}
	held, err := advisory.IsHeld(ctx, pool, pglocks.KeyOf("queue:item:7"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("held after commit:", held)
	// Output:
	// held inside the transaction: true
	// held after commit: false
}

// Holders shows who holds a key, as an operator would look it up.
func ExampleHolders() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, cleanup := examplePool(ctx)
	defer cleanup()
	locker, err := advisory.New(pool, advisory.Config{ApplicationName: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(context.Background())

	key := pglocks.KeyOf("billing:run")
	if _, err := locker.RLock(ctx, key); err != nil {
		log.Fatal(err)
	}
	holders, err := advisory.Holders(ctx, pool, key)
	if err != nil {
		log.Fatal(err)
	}
	for _, h := range holders {
		fmt.Println(h.ApplicationName, h.Mode, h.Granted)
	}
	// Output: billing ShareLock true
}
