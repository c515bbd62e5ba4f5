package schedule_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/schedule"
)

// Two replicas ask for the same slot of the job "invoice-run" — here an
// explicit key, the day; with Policy.Period, Job.Do takes the slot of the
// server's clock. The first runs it; the second learns who did.
func ExampleJob_DoSlot() {
	ctx := context.Background()
	dsn, err := pgtest.ExampleDSN(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, host := range []string{"replica-a", "replica-b"} {
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			log.Fatal(err)
		}
		defer pool.Close()
		store, err := lease.New(pool, lease.Config{Hostname: host})
		if err != nil {
			log.Fatal(err)
		}
		defer store.Close(ctx)
		runner, err := schedule.New(schedule.Config{Store: store, Pool: pool})
		if err != nil {
			log.Fatal(err)
		}
		if err := runner.Migrate(ctx); err != nil {
			log.Fatal(err)
		}
		job, err := runner.Job("invoice-run", schedule.Policy{})
		if err != nil {
			log.Fatal(err)
		}
		rec, err := job.DoSlot(ctx, "2026-11-23", func(ctx context.Context, run *schedule.Run) error {
			// ... the job's work; its writes guarded by run.Lease().Guard(ctx, tx) ...
			return nil
		})
		var taken *schedule.TakenError
		switch {
		case errors.As(err, &taken):
			fmt.Printf("%s: slot %s taken by %s (token %d, %s)\n", host, taken.Slot, taken.By.Hostname, taken.By.Token, taken.By.Outcome)
		case err != nil:
			log.Fatal(err)
		default:
			fmt.Printf("%s: ran slot %s (token %d, %s)\n", host, rec.Slot, rec.Token, rec.Outcome)
		}
	}
	// Output:
	// replica-a: ran slot 2026-11-23 (token 1, succeeded)
	// replica-b: slot 2026-11-23 taken by replica-a (token 1, succeeded)
}
