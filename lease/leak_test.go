package lease_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
)

// TestListenerFlatOverNotifications: the listener's memory and
// goroutines stay flat over 100k notifications received while an interest
// lock is being retried (a foreign session holds the interest key), the
// state in which each wait used to leak a context. A first round warms up;
// the second is measured.
//
// Not parallel: it measures the process heap.
func TestListenerFlatOverNotifications(t *testing.T) {
	b := setup(t)
	ctx := ctxT(t)
	mustTry(t, b.store, "w", time.Hour)
	foreign := b.db.Conn(t)
	key := pglocks.KeyOf("pglocks.lease:pglocks_leases:w").Int64()
	if _, err := foreign.Exec(ctx, "select pg_advisory_lock($1)", key); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		_, err := b.store.Acquire(wctx, "w", time.Minute)
		got <- err
	}()
	waitParked(t, b.store)
	// A round is 100k notifications in ten batches, each followed by a
	// notification announcing the loss of a lease the store holds:
	// notifications arrive in order, so when that lease is lost the batch
	// has been consumed. Batches keep pgx's backlog — notifications that
	// arrived during a statement, kept in a slice whose array lives on
	// until the next backlog — to a tenth of a round.
	const n, batch = 100_000, 10_000
	seq := 0
	round := func() {
		for range n / batch {
			seq++
			sentinel := mustTry(t, b.store, fmt.Sprintf("s%d", seq), time.Hour)
			exec(t, b.pool, "select pg_notify('pglocks_leases', 'other-' || i) from generate_series(1, $1::int) i", batch)
			exec(t, b.pool, "select pg_notify('pglocks_leases', $1)", fmt.Sprintf("l%d:s%d", sentinel.Token(), seq))
			waitFor(t, sentinel.Lost(), time.Minute, "the end of the batch")
		}
	}
	round() // warm up
	heap0, gr0 := heapAndGoroutines()
	round()
	heap1, gr1 := heapAndGoroutines()
	t.Logf("over %d notifications: heap %+.1f MB, goroutines %+d", n, float64(heap1-heap0)/1e6, gr1-gr0)
	if heap1-heap0 > 2e6 {
		t.Errorf("heap grew by %.1f MB over %d notifications", float64(heap1-heap0)/1e6, n)
	}
	if gr1-gr0 > 2 {
		t.Errorf("goroutines went from %d to %d", gr0, gr1)
	}
	cancel()
	<-got
	_, _ = foreign.Exec(context.Background(), "select pg_advisory_unlock_all()")
}

func heapAndGoroutines() (int64, int) {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc), runtime.NumGoroutine()
}
