package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/plant"
	"github.com/pglocks/pglocks/lease"
)

// Worker environment: set by the parent when it re-executes the test binary.
const (
	envWorker   = "CHAOS_WORKER" // worker number
	envDSN      = "CHAOS_DSN"
	envOut      = "CHAOS_OUT"      // history file
	envNames    = "CHAOS_NAMES"    // how many names to contend for
	envWorkload = "CHAOS_WORKLOAD" // lease (default), advisory, leader or semaphore
	envPlant    = "CHAOS_PLANT"    // a bug to plant (internal/plant.Names)
	envNoWrites = "CHAOS_NOWRITES" // lease clients make no guarded writes
	envNoReads  = "CHAOS_NOREADS"  // lease clients make no reads of the protected value
	// envDurableReads: lease clients read the protected value with FOR
	// SHARE, whose commit waits for a synchronous standby.
	envDurableReads = "CHAOS_DURABLE_READS"
	envGoroutines   = "CHAOS_GOROUTINES" // clients per worker process (default 4)
)

// runWorker runs a worker when the test binary was started as one, and
// exits; it returns false otherwise.
func runWorker() bool {
	p, err := strconv.Atoi(os.Getenv(envWorker))
	if err != nil {
		return false
	}
	if b, ok := plant.Names[os.Getenv(envPlant)]; ok {
		plant.Set(b)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	baseline := runtime.NumGoroutine()
	rec, err := newRecorder(os.Getenv(envOut), p)
	if err == nil {
		err = leaseWorker(ctx, rec)
	}
	if err == nil {
		checkGoroutines(rec, baseline)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos worker:", err)
		os.Exit(1)
	}
	os.Exit(0)
	return true
}

// checkGoroutines records a leak event if, once the worker has closed
// everything it opened, its goroutines do not come back to baseline
// within ten seconds.
func checkGoroutines(rec *recorder, baseline int) {
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > baseline {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			buf = buf[:runtime.Stack(buf, true)]
			rec.write(event{K: evLeak, T: mono(), Val: int64(runtime.NumGoroutine()),
				Text: fmt.Sprintf("%d goroutines after shutdown, %d at start:\n%s", runtime.NumGoroutine(), baseline, buf)})
			return
		}
		time.Sleep(10 * time.Millisecond) // polling a count, not synchronizing
	}
}

// leaseWorker contends for a few names until SIGTERM: acquire, guarded
// writes with trust checks, reads, release or abandon to expiry.
func leaseWorker(ctx context.Context, rec *recorder) error {
	cfg, err := pgxpool.ParseConfig(os.Getenv(envDSN))
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(2 * goroutines())
	// pgxpool pings an idle connection before handing it out, with no
	// timeout by default: under lost replies such a ping waits until a
	// minute after its caller gave up, holding the connection, and
	// pool.Close waits for it (a worker once missed its shutdown minute
	// that way, stacks showing Acquire's ping). Bound it as a client on a
	// lossy network should.
	cfg.PingTimeout = 5 * time.Second
	cfg.ConnConfig.RuntimeParams["application_name"] = fmt.Sprintf("chaos-w%d", rec.p)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	// BatchAfter 1: with a few clients per process, calls still meet in
	// batches, so that the faults hit batched calls too.
	store, err := lease.New(pool, lease.Config{BatchAfter: 1})
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = store.Close(cctx)
	}()
	names, _ := strconv.Atoi(os.Getenv(envNames))
	names = max(names, 1)
	rec.note("worker %d started, pid %d", rec.p, os.Getpid())
	switch os.Getenv(envWorkload) {
	case "advisory":
		return advisoryWorker(ctx, rec, pool, names)
	case "leader":
		return leaderWorker(ctx, rec, pool, store, names)
	case "semaphore":
		return semaphoreWorker(ctx, rec, pool, store)
	}
	return clients(ctx, func(id int64) {
		w := &leaseW{rec: rec, pool: pool, store: store, names: names, id: id}
		for ctx.Err() == nil {
			w.round(ctx)
		}
	})
}

// clients runs the goroutines of a worker process and waits for them.
func clients(ctx context.Context, run func(id int64)) error {
	var wg sync.WaitGroup
	for i := range goroutines() {
		wg.Go(func() { run(int64(i)) })
	}
	wg.Wait()
	return nil
}

// goroutines is how many clients each worker process runs: 4, or
// CHAOS_GOROUTINES.
func goroutines() int {
	if n, err := strconv.Atoi(os.Getenv(envGoroutines)); err == nil && n > 0 {
		return n
	}
	return 4
}

type leaseW struct {
	rec   *recorder
	pool  *pgxpool.Pool
	store *lease.Store
	names int
	id    int64 // client number within the process
	val   int64 // values written by this client; unique with its process
}

// opCtx bounds one operation: short, so that a lost reply ends as an
// unknown outcome rather than a hang.
func opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 300*time.Millisecond+rand.N(700*time.Millisecond))
}

// round is one acquisition attempt and, when it succeeds, a tenure.
func (w *leaseW) round(ctx context.Context) {
	name := fmt.Sprintf("n%d", rand.N(w.names))
	if rand.N(4) == 0 && os.Getenv(envNoReads) == "" {
		w.read(ctx, name)
	}
	ttl := time.Duration(800+rand.N(1700)) * time.Millisecond
	var opts []lease.Option
	if rand.N(2) == 0 {
		opts = append(opts, lease.WithKeepAlive())
	}
	id := w.rec.call(opAcquire, name, 0, 0)
	octx, cancel := opCtx(ctx)
	var l *lease.Lease
	var err error
	if rand.N(3) == 0 {
		l, err = w.store.Acquire(octx, name, ttl, opts...)
	} else {
		l, err = w.store.TryAcquire(octx, name, ttl, opts...)
	}
	cancel()
	switch {
	case err == nil:
		w.rec.ret(id, resOK, l.Token(), 0)
	case errors.Is(err, lease.ErrHeld):
		w.rec.ret(id, resBusy, 0, 0)
		pause(ctx, 20*time.Millisecond)
		return
	default: // an error, or a blocking Acquire's deadline: recorded as unknown
		w.rec.ret(id, resUnknown, 0, 0)
		pause(ctx, 20*time.Millisecond)
		return
	}
	w.tenure(ctx, l)
}

// tenure uses a held lease: guarded writes with trust checks between them,
// then a release, or abandonment to expiry, or an overstay past the TTL.
func (w *leaseW) tenure(ctx context.Context, l *lease.Lease) {
	writes := 1 + rand.N(4)
	if os.Getenv(envNoWrites) != "" {
		writes = 0
	}
	for i := 0; i < writes && ctx.Err() == nil; i++ {
		if !w.trusted(l) {
			break
		}
		w.write(ctx, l)
		if rand.N(16) == 0 { // overstay: the TTL may pass, another may take it
			pause(ctx, l.TTL())
		}
	}
	w.trusted(l) // closes the window of a tenure with one write
	if rand.N(6) == 0 {
		return // abandoned: the row expires
	}
	for try := 0; try < 3; try++ {
		id := w.rec.call(opRelease, l.Name(), l.Token(), 0)
		// A short bound, well inside the trust window: if the reply is
		// lost, the lease's fate is decided while it may still be trusted.
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(100+rand.N(200))*time.Millisecond)
		err := l.Release(octx)
		cancel()
		switch {
		case err == nil:
			w.rec.ret(id, resOK, 0, 0)
			if rand.N(4) == 0 && os.Getenv(envNoWrites) == "" {
				w.write(ctx, l) // a stale write: the guard must refuse it
			}
			return
		case errors.Is(err, lease.ErrNotHeld):
			w.rec.ret(id, resNotHeld, 0, 0)
			return
		}
		w.rec.ret(id, resUnknown, 0, 0)
		// A careful user still trusts a lease that reports no loss, and
		// works on a while before retrying: exactly where an ambiguous
		// release that kept the lease live gave two holders.
		end := time.Now().Add(time.Duration(50+rand.N(400)) * time.Millisecond)
		for ctx.Err() == nil && time.Now().Before(end) && w.trusted(l) && os.Getenv(envNoWrites) == "" {
			w.write(ctx, l)
			pause(ctx, 10*time.Millisecond)
		}
	}
}

// trusted checks, and records, that l is still held: a live Context and
// a trust deadline ahead.
func (w *leaseW) trusted(l *lease.Lease) bool {
	return w.rec.trust(l.Name(), l.Token(), func() bool {
		return l.Context().Err() == nil && time.Now().Before(l.TrustedUntil())
	})
}

// write is a guarded transaction: the protected value and the counter
// change only while the lease is held.
func (w *leaseW) write(ctx context.Context, l *lease.Lease) {
	w.val++
	guardedWrite(ctx, w.rec, w.pool, l.Name(), l.Token(), int64(w.rec.p)<<40|w.id<<32|w.val, l.Guard)
}

// guardedWrite records and makes one write of v to name's protected row,
// in a transaction that guard fences with token tok.
func guardedWrite(ctx context.Context, rec *recorder, pool *pgxpool.Pool, name string, tok, v int64, guard func(context.Context, pgx.Tx) error) {
	id := rec.call(opWrite, name, tok, v)
	octx, cancel := opCtx(ctx)
	defer cancel()
	err := pgx.BeginFunc(octx, pool, func(tx pgx.Tx) error {
		if err := guard(octx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(octx, "update protected set val = $2, n = n + 1 where name = $1", name, v)
		return err
	})
	switch {
	case err == nil:
		rec.ret(id, resOK, 0, 0)
	case errors.Is(err, lease.ErrNotHeld) || errors.Is(err, lease.ErrLost) || errors.Is(err, lease.ErrReleased):
		rec.ret(id, resRefused, 0, 0)
	default:
		rec.ret(id, resUnknown, 0, 0)
	}
}

// read records the protected value. A durable read locks the row, so its
// commit waits until a synchronous standby has everything it read.
func (w *leaseW) read(ctx context.Context, name string) {
	id := w.rec.call(opRead, name, 0, 0)
	octx, cancel := opCtx(ctx)
	defer cancel()
	sql := "select val from protected where name = $1"
	if os.Getenv(envDurableReads) != "" {
		sql += " for share"
	}
	var v int64
	err := pgx.BeginFunc(octx, w.pool, func(tx pgx.Tx) error {
		return tx.QueryRow(octx, sql, name).Scan(&v)
	})
	if err != nil {
		w.rec.ret(id, resUnknown, 0, 0)
		return
	}
	w.rec.ret(id, resOK, 0, v)
}

// pause waits d or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
