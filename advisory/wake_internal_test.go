package advisory

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/pgtest"
)

// contended reports whether l has heard that a waiter elsewhere wants key.
func (l *Locker) contended(key pglocks.Key) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	ks := l.keys[idOf(key)]
	return ks != nil && ks.contended
}

// wakeRound holds key on holder, starts a waiter on waiter, waits until the
// holder has heard the waiter ask for a notification, unlocks, and returns
// the time from Unlock to the waiter holding the lock.
func wakeRound(tb testing.TB, holder, waiter *Locker, key pglocks.Key) time.Duration {
	ctx := context.Background()
	lk, err := holder.Lock(ctx, key)
	if err != nil {
		tb.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		w, err := waiter.Lock(ctx, key)
		if err != nil {
			tb.Error(err)
			close(got)
			return
		}
		got <- time.Now()
		_ = w.Unlock(ctx)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !holder.contended(key) {
		if time.Now().After(deadline) {
			tb.Fatal("the holder never heard that a waiter wants the key")
		}
		<-time.After(50 * time.Microsecond)
	}
	start := time.Now()
	if err := lk.Unlock(ctx); err != nil {
		tb.Fatal(err)
	}
	at, ok := <-got
	if !ok {
		tb.FailNow()
	}
	return at.Sub(start)
}

// wakePair returns two lockers on one database, the waiter with a backoff so
// long that only a notification can wake it promptly.
func wakePair(tb testing.TB) (holder, waiter *Locker) {
	db := pgtest.New(tb)
	pool := db.NewPool(tb, func(c *pgxpool.Config) { c.MaxConns = 4 })
	holder, err := New(pool, Config{})
	if err != nil {
		tb.Fatal(err)
	}
	waiter, err = New(pool, Config{MinBackoff: time.Second, MaxBackoff: 5 * time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = holder.Close(context.Background())
		_ = waiter.Close(context.Background())
	})
	return holder, waiter
}

func TestWakeUpLatency(t *testing.T) {
	t.Parallel()
	holder, waiter := wakePair(t)
	key := pglocks.KeyOf("wake")
	var lat []time.Duration
	for range 30 {
		lat = append(lat, wakeRound(t, holder, waiter, key))
	}
	slices.Sort(lat)
	p50 := lat[len(lat)/2]
	t.Logf("wake-up from Unlock to a waiter in another locker holding: p50 %v, p90 %v, max %v",
		p50, lat[len(lat)*9/10], lat[len(lat)-1])
	// The waiter's backoff is at least 1 s: a median far below it shows
	// that the notification woke it. (The speed itself is measured by
	// BenchmarkWakeUp, not asserted here: a loaded machine stretches it.)
	if p50 > 500*time.Millisecond {
		t.Errorf("wake-up p50 %v, want well under the waiter's 1s backoff", p50)
	}
}

func BenchmarkWakeUp(b *testing.B) {
	holder, waiter := wakePair(b)
	key := pglocks.KeyOf("wake-bench")
	var total time.Duration
	for b.Loop() {
		total += wakeRound(b, holder, waiter, key)
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs-wake/op")
}

// asked reports whether l keeps a recent ask for key, not held here.
func (l *Locker) asked(key pglocks.Key) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.asks[idOf(key)]
	return ok
}

// TestAskHeardBeforeHolding: a waiter elsewhere asked to be notified while
// a client that sends no wake-ups (plain SQL) held the key; the Locker
// that takes the key next knows of the ask at once, so its unlock will
// notify, instead of leaving the waiter to poll until it asks again (every
// askInterval).
func TestAskHeardBeforeHolding(t *testing.T) {
	t.Parallel()
	holder, waiter := wakePair(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key, warm := pglocks.KeyOf("ask-heard"), pglocks.KeyOf("ask-warm")
	// Open a session on each, so that both listeners start, and wait until
	// both LISTEN: a listener that connects wakes every waiter of its
	// locker, which would let the waiter win the race below.
	for _, l := range []*Locker{holder, waiter} {
		lk, err := l.TryLock(ctx, warm)
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for {
		var n int
		if err := holder.pool.QueryRow(ctx, `select count(*) from pg_stat_activity
			where datname = current_database() and query ilike 'listen%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n >= 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the lockers' listeners never LISTENed")
		}
		<-time.After(time.Millisecond)
	}
	plain, err := holder.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Release()
	if _, err := plain.Exec(ctx, "select pg_advisory_lock($1)", key.Int64()); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		w, err := waiter.Lock(ctx, key)
		if err == nil {
			err = w.Unlock(ctx)
		}
		got <- err
	}()
	for !holder.asked(key) {
		if ctx.Err() != nil {
			t.Fatal("the holder-to-be never heard the waiter ask")
		}
		<-time.After(time.Millisecond)
	}
	if _, err := plain.Exec(ctx, "select pg_advisory_unlock($1)", key.Int64()); err != nil {
		t.Fatal(err)
	}
	lk, err := holder.TryLock(ctx, key)
	if err != nil {
		t.Fatalf("the holder-to-be's try right after the plain unlock: %v (the waiter polls every second or more)", err)
	}
	if !holder.contended(key) {
		t.Error("the new holder does not know that a waiter asked: its unlock would not notify")
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}
