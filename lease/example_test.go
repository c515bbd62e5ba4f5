package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// The examples run against a server of their own (examples have no
// testing.T to ask pgtest for the shared one), closed by TestMain.
var examples struct {
	once sync.Once
	srv  *pgtest.Server
	err  error
}

// examplePool returns a pool on a fresh database with the lease table, and
// a function that closes the pool and drops the database.
func examplePool() (*pgxpool.Pool, func()) {
	ctx := context.Background()
	examples.once.Do(func() { examples.srv, examples.err = pgtest.Start(ctx) })
	if examples.err != nil {
		log.Fatal(examples.err)
	}
	db, err := examples.srv.CreateDatabase(ctx)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, db.DSN)
	if err != nil {
		log.Fatal(err)
	}
	return pool, func() {
		pool.Close()
		if err := db.Drop(ctx); err != nil {
			log.Print(err)
		}
	}
}

func closeExamples() {
	if examples.srv != nil {
		if err := examples.srv.Close(); err != nil {
			log.Print(err)
		}
	}
}

func ExampleStore_TryAcquire() {
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

	l, err := store.TryAcquire(ctx, "report:monthly", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("acquired with token", l.Token())

	_, err = store.TryAcquire(ctx, "report:monthly", 30*time.Second)
	var held *lease.HeldError
	if errors.As(err, &held) {
		fmt.Println("second try: held, token", held.Token, "same owner:", held.Owner == l.Owner())
	}

	if err := l.Release(ctx); err != nil {
		log.Fatal(err)
	}
	l, err = store.TryAcquire(ctx, "report:monthly", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("after release: token", l.Token())
	// Output:
	// acquired with token 1
	// second try: held, token 1 same owner: true
	// after release: token 2
}

func ExampleStore_Do() {
	ctx := context.Background()
	pool, done := examplePool()
	defer done()
	store, _ := lease.New(pool, lease.Config{})
	defer store.Close(ctx)
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	// Runs once across every replica at a time; renewed in the background;
	// ctx is cancelled if the lease is lost.
	err := store.Do(ctx, "nightly-import", time.Minute, func(ctx context.Context) error {
		fmt.Println("importing")
		return nil
	})
	fmt.Println("done:", err)
	// Output:
	// importing
	// done: <nil>
}

func ExampleLease_Guard() {
	ctx := context.Background()
	pool, done := examplePool()
	defer done()
	store, _ := lease.New(pool, lease.Config{})
	defer store.Close(ctx)
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "create table balance (amount int); insert into balance values (100)"); err != nil {
		log.Fatal(err)
	}

	l, err := store.TryAcquire(ctx, "account:7", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	// The update commits only if the lease is still ours; no takeover can
	// commit before this transaction ends.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := l.Guard(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "update balance set amount = amount - 30")
		return err
	})
	fmt.Println("guarded write:", err)

	// An operator breaks the lease: the old holder's writes are refused.
	if _, err := store.Break(ctx, "account:7"); err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return l.Guard(ctx, tx) })
	fmt.Println("after Break:", errors.Is(err, lease.ErrNotHeld))
	// Output:
	// guarded write: <nil>
	// after Break: true
}

func ExampleHandle() {
	ctx := context.Background()
	pool, done := examplePool()
	defer done()
	api, _ := lease.New(pool, lease.Config{})
	defer api.Close(ctx)
	if err := api.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	// The API process acquires the lease and puts it in a queue job.
	l, err := api.TryAcquire(ctx, "invoice:42", 5*time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	job, _ := json.Marshal(struct {
		Invoice int          `json:"invoice"`
		Lease   lease.Handle `json:"lease"`
	}{42, l.Handle()})

	// The worker (another process, another store) resumes it.
	worker, _ := lease.New(pool, lease.Config{})
	defer worker.Close(ctx)
	var msg struct {
		Lease lease.Handle `json:"lease"`
	}
	if err := json.Unmarshal(job, &msg); err != nil {
		log.Fatal(err)
	}
	wl, err := worker.Resume(ctx, msg.Lease)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("worker holds", wl.Name(), "token", wl.Token())
	fmt.Println("release:", wl.Release(ctx))
	// Output:
	// worker holds invoice:42 token 1
	// release: <nil>
}
