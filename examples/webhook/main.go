// Command webhook shows a payment webhook processed exactly once, however
// often and however concurrently it is delivered, with fenced writes.
//
//	go run ./examples/webhook
//
// Each delivery takes the lease "webhook:payment:<id>", then, in one
// transaction, checks the lease with [lease.Lease.Guard], checks that the
// payment was not processed yet, credits the account and records the payment.
// The first delivery stalls (think of a long GC pause) while holding the lease
// and wakes up after it expired and the others have run: Guard refuses its
// write. It runs on a throwaway PostgreSQL; with -dsn URL it runs in a
// schema of its own in that database (its lease and payment tables),
// dropped at the end.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglocks/pglocks/examples/internal/exampledb"
	"github.com/pglocks/pglocks/lease"
)

const (
	deliveries = 5
	// ttl is short so that the stalled delivery's lease expires quickly.
	ttl = time.Second
)

const schema = `
create table if not exists webhook_payments (
	payment_id   text primary key,
	lease_token  bigint not null,
	processed_at timestamptz not null default now()
);
-- No unique key on payment_id here: a double credit would show.
create table if not exists webhook_credits (
	payment_id   text not null,
	account      text not null,
	amount_cents bigint not null
);`

func main() { exampledb.Main(run) }

// event is one webhook payload.
type event struct {
	PaymentID   string
	Account     string
	AmountCents int64
}

// outcome is what one delivery did.
type outcome int

const (
	processed outcome = iota
	duplicate         // already processed: acknowledge, do nothing
	refused           // the lease was lost: write rolled back, let the sender retry
)

// handler processes webhook deliveries.
type handler struct {
	pool  *pgxpool.Pool
	store *lease.Store
}

// deliver handles one delivery of ev: it waits for the payment's lease and
// processes ev under it.
func (h *handler) deliver(ctx context.Context, ev event) (outcome, *lease.Lease, error) {
	l, err := h.store.Acquire(ctx, "webhook:payment:"+ev.PaymentID, ttl)
	if err != nil {
		return 0, nil, err
	}
	defer l.Release(context.WithoutCancel(ctx))
	o, err := h.process(ctx, l, ev)
	return o, l, err
}

// process writes ev's effects, fenced by l: they commit only if l is still
// held when the transaction commits, and only if ev was not processed yet.
func (h *handler) process(ctx context.Context, l *lease.Lease, ev event) (o outcome, err error) {
	err = pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
		// Locks the lease row FOR SHARE: no one can take the lease over
		// until this transaction ends.
		if err := l.Guard(ctx, tx); err != nil {
			return err
		}
		var done bool
		if err := tx.QueryRow(ctx,
			`select exists (select from webhook_payments where payment_id = $1)`, ev.PaymentID,
		).Scan(&done); err != nil {
			return err
		}
		if done {
			o = duplicate
			return nil
		}
		if _, err := tx.Exec(ctx,
			`insert into webhook_credits (payment_id, account, amount_cents) values ($1, $2, $3)`,
			ev.PaymentID, ev.Account, ev.AmountCents); err != nil {
			return err
		}
		_, err := tx.Exec(ctx,
			`insert into webhook_payments (payment_id, lease_token) values ($1, $2)`, ev.PaymentID, l.Token())
		o = processed
		return err
	})
	if errors.Is(err, lease.ErrNotHeld) {
		return refused, nil
	}
	return o, err
}

// summary is what run saw.
type summary struct {
	Processed, Duplicates, Refused int
	// Credits is how many credits the payment got.
	Credits int
}

func (s *summary) count(o outcome) {
	switch o {
	case processed:
		s.Processed++
	case duplicate:
		s.Duplicates++
	case refused:
		s.Refused++
	}
}

func (o outcome) String() string {
	return [...]string{"processed", "duplicate, already processed", "refused: lease lost"}[o]
}

// run delivers one payment event several times at once.
func run(ctx context.Context, db exampledb.Target, out io.Writer) (sum summary, err error) {
	pool, err := pgxpool.New(ctx, db.DSN)
	if err != nil {
		return sum, err
	}
	defer pool.Close()
	store, err := lease.New(pool, lease.Config{Schema: db.Schema})
	if err != nil {
		return sum, err
	}
	defer store.Close(context.WithoutCancel(ctx))
	if err := store.Migrate(ctx); err != nil {
		return sum, err
	}
	if _, err := pool.Exec(ctx, schema); err != nil {
		return sum, err
	}
	h := &handler{pool: pool, store: store}
	ev := event{PaymentID: "pay_" + uuid.NewString()[:8], Account: "acct_42", AmountCents: 1999}
	fmt.Fprintf(out, "%d deliveries of payment %s (%d cents to %s)\n", deliveries, ev.PaymentID, ev.AmountCents, ev.Account)

	// Delivery 1 takes the lease, then stalls past its TTL.
	stale, err := store.Acquire(ctx, "webhook:payment:"+ev.PaymentID, ttl)
	if err != nil {
		return sum, err
	}
	fmt.Fprintf(out, "delivery 1: lease token %d, then stalls for longer than the %v TTL\n", stale.Token(), ttl)

	// Deliveries 2..n arrive at once; they wait until the stalled lease expires.
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, deliveries)
	for i := 2; i <= deliveries; i++ {
		wg.Go(func() {
			o, l, err := h.deliver(ctx, ev)
			if err != nil {
				errs[i-1] = fmt.Errorf("delivery %d: %w", i, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			sum.count(o)
			fmt.Fprintf(out, "delivery %d: lease token %d, %v\n", i, l.Token(), o)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return sum, err
	}

	// Delivery 1 wakes up and writes: Guard refuses, nothing commits.
	o, err := h.process(ctx, stale, ev)
	if err != nil {
		return sum, fmt.Errorf("delivery 1: %w", err)
	}
	sum.count(o)
	fmt.Fprintf(out, "delivery 1: wakes up with token %d, %v\n", stale.Token(), o)

	if err := pool.QueryRow(ctx,
		`select count(*) from webhook_credits where payment_id = $1`, ev.PaymentID,
	).Scan(&sum.Credits); err != nil {
		return sum, err
	}
	fmt.Fprintf(out, "%d deliveries: %d processed, %d duplicates, %d refused; account credited %d time(s)\n",
		deliveries, sum.Processed, sum.Duplicates, sum.Refused, sum.Credits)
	return sum, nil
}
