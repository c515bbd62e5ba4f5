package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
)

// leaderTTL is the leader workload's lease TTL: short, so that a killed or
// cut-off leader's term expires during the run, and within the after-run
// check's wait for rows to be freed.
const leaderTTL = 2 * time.Second

// leaderWorker runs one candidate per election ("n0" …) in this process,
// all on one Locker and one Store, until ctx ends. Each term is one
// acquisition of the fenced-lock model: its campaign is the acquire call
// (recorded when the candidate starts campaigning), its election the
// return with the term number as the token. A leader makes guarded writes
// with Term.Guard, checks and records its trust (the work context live and
// Term.TrustedUntil ahead) between them, and resigns after a few, so that
// terms turn over. Terms are not released in the model: a later term's
// election makes an earlier one stale, which is what the fence must
// enforce.
func leaderWorker(ctx context.Context, rec *recorder, pool *pgxpool.Pool, store *lease.Store, names int) error {
	lk, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = lk.Close(cctx)
	}()
	var wg sync.WaitGroup
	errs := make(chan error, names)
	for i := range names {
		name := fmt.Sprintf("n%d", i)
		e, err := leader.New(leader.Config{Name: name, Pool: pool, Locker: lk, Store: store,
			Identity: fmt.Sprintf("w%d", rec.p), TTL: leaderTTL, RetryInterval: 200 * time.Millisecond})
		if err != nil {
			return err
		}
		c := &candidate{rec: rec, pool: pool, name: name}
		wg.Go(func() {
			defer func() {
				cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = e.Close(cctx)
			}()
			c.campaign = rec.call(opAcquire, name, 0, 0)
			if err := e.Run(ctx, c.lead); err != nil && ctx.Err() == nil {
				errs <- fmt.Errorf("election %s: %w", name, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs // nil when no election failed
}

// candidate is this process's candidate in one election.
type candidate struct {
	rec      *recorder
	pool     *pgxpool.Pool
	name     string
	campaign int64 // the open acquire call: the campaign under way
	val      int64
}

// lead is the work of one term: it closes the campaign's call with the
// term number, writes a few times under the fence, and resigns, opening
// the next campaign's call.
func (c *candidate) lead(ctx context.Context, term leader.Term) error {
	c.rec.ret(c.campaign, resOK, term.Number, 0)
	for range 5 + rand.N(45) {
		if !c.trusted(ctx, term) {
			break
		}
		c.val++
		guardedWrite(ctx, c.rec, c.pool, c.name, term.Number, int64(c.rec.p)<<40|c.val, term.Guard)
		pause(ctx, time.Duration(rand.N(10))*time.Millisecond)
	}
	c.trusted(ctx, term)
	c.campaign = c.rec.call(opAcquire, c.name, 0, 0)
	return nil // resign: the elector campaigns again after RetryInterval
}

// trusted checks, and records, that the term may still be trusted: the
// work context live and its trust deadline ahead.
func (c *candidate) trusted(ctx context.Context, term leader.Term) bool {
	return c.rec.trust(c.name, term.Number, func() bool {
		return ctx.Err() == nil && time.Now().Before(term.TrustedUntil())
	})
}
