package leader_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
)

// TestManyElections runs 1,000 elections in one process on one pool, one
// advisory Locker and one lease Store: all must be elected, on a handful of
// connections.
func TestManyElections(t *testing.T) {
	t.Parallel()
	n := 1000
	if testing.Short() {
		n = 50
	}
	db := setup(t)
	const maxConns = 8
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = maxConns })
	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var elected atomic.Int64
	allIn := make(chan struct{})
	runs := make(chan error, n)
	start := time.Now()
	for i := range n {
		e, err := leader.New(leader.Config{
			Name: fmt.Sprintf("shard-%d", i), Pool: pool, Locker: locker, Store: store,
		})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			runs <- e.Run(ctx, func(ctx context.Context, term leader.Term) error {
				if elected.Add(1) == int64(n) {
					close(allIn)
				}
				<-ctx.Done()
				return nil
			})
		}()
	}
	select {
	case <-allIn:
	case <-time.After(2 * time.Minute):
		t.Fatalf("only %d of %d elections elected a leader", elected.Load(), n)
	}
	took := time.Since(start)
	var conns int
	if err := db.Conn(t).QueryRow(ctxT(t, 30*time.Second),
		"select count(*) from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()").Scan(&conns); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d elections: all elected in %v, on %d server connections (pool max %d, advisory sessions %d, + the locker's and the store's listeners)",
		n, took.Round(time.Millisecond), conns, maxConns, locker.Config().MaxSessions)
	if limit := maxConns + locker.Config().MaxSessions + 2; conns > limit {
		t.Errorf("%d elections used %d connections, more than %d", n, conns, limit)
	}
	cancel()
	for range n {
		if err := <-runs; err != nil {
			t.Error(err)
		}
	}
	cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
	defer ccancel()
	if err := store.Close(cctx); err != nil {
		t.Error(err)
	}
	if err := locker.Close(cctx); err != nil {
		t.Error(err)
	}
}
