package gocronleader_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/gocronleader"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// Every replica runs the same scheduler; only the leader's runs the jobs.
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
	if err := migrate(ctx, pool); err != nil { // once per database
		log.Fatal(err)
	}

	elected := make(chan struct{}, 1)
	le, err := leader.New(leader.Config{Name: "report-jobs", Pool: pool,
		OnElected: func(leader.Term) {
			select {
			case elected <- struct{}{}:
			default:
			}
		}})
	if err != nil {
		log.Fatal(err)
	}
	defer le.Close(ctx)
	elector, err := gocronleader.Start(le)
	if err != nil {
		log.Fatal(err)
	}
	defer elector.Close(ctx) // before le.Close: defers run last first

	s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Shutdown() // first: no run under way when the term ends
	ran := make(chan struct{})
	_, err = s.NewJob(gocron.DurationJob(time.Hour), gocron.NewTask(func() {
		fmt.Println("report sent")
		close(ran)
	}), gocron.WithStartAt(gocron.WithStartImmediately()))
	if err != nil {
		log.Fatal(err)
	}
	<-elected // here, so that the immediate first run is not skipped
	s.Start()
	<-ran
	// Output: report sent
}

// migrate creates the lease table the election needs.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		return err
	}
	defer store.Close(ctx)
	return store.Migrate(ctx)
}
