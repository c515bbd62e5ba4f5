package shard_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/plant"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/shard"
)

// The environment of a member process: the test binary started again by
// procCluster.spawn, which runs procChild instead of the tests.
const (
	envProcDSN   = "SHARD_PROC_DSN"    // the database; set, it makes the process a member
	envProcID    = "SHARD_PROC_ID"     // the member's identity, and its lease rows' hostname
	envProcN     = "SHARD_PROC_SHARDS" // the group's shards are "0" … "N-1"
	envProcTTL   = "SHARD_PROC_TTL"
	envProcPoll  = "SHARD_PROC_POLL"
	envProcEvery = "SHARD_PROC_EVERY" // the mean pause between an owner's fenced writes
	envProcHold  = "SHARD_PROC_HOLD"  // how long a write's transaction stays open after its Guard
	envProcPlant = "SHARD_PROC_PLANT" // a bug to plant (internal/plant.Names): the checker's own test
	envProcDebug = "SHARD_PROC_DEBUG" // set: the members log at Debug, for the takeover's breakdown
	// envProcSharedPool set makes the Store share the owners' pool (else
	// it has a pool of its own).
	envProcSharedPool = "SHARD_PROC_SHARED_POOL"
)

// procGroup is the group of the member processes.
const procGroup = "procs"

// procInsertSQL is a fenced write, run after the term's Guard in the same
// transaction. Besides the writer's term it records the shard's lease row
// as the transaction sees it — under the Guard's row lock, so the row's
// term stays the same until the commit — and a number from one sequence
// taken after the Guard: two writes of a shard by different terms are
// numbered in their commit order, since the later term's acquisition
// waited for the earlier write's commit (see procCheck).
const procInsertSQL = `insert into proc_writes (seq, shard, token, member, owner, row_token, row_owner, row_left, late)
select nextval('proc_write_seq'), $1, $2, $3, $4::uuid, l.token, l.owner, l.expires_at - clock_timestamp(), $6
from (values (1)) v left join pglocks_leases l on l.name = $5`

// runProcChild runs a member process when the test binary was started as
// one (SHARD_PROC_DSN set), and exits; it returns false otherwise.
func runProcChild() bool {
	dsn := os.Getenv(envProcDSN)
	if dsn == "" {
		return false
	}
	if err := procChild(dsn); err != nil {
		fmt.Println("ERROR", strings.ReplaceAll(err.Error(), "\n", " "))
		os.Exit(1)
	}
	os.Exit(0)
	return true
}

// procChild is one member: it prints READY, runs the group's Member with
// an owner function that makes fenced writes, and leaves on SIGTERM.
// SIGUSR1 pauses the writes (a group at rest) and SIGUSR2 resumes them.
// Its report lines (REFUSED, LATE, WERR) and the shard package's
// warnings go to stdout, one line each, for the parent to count.
func procChild(dsn string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if b, ok := plant.Names[os.Getenv(envProcPlant)]; ok {
		plant.Set(b)
	}
	id := os.Getenv(envProcID)
	n, err := strconv.Atoi(os.Getenv(envProcN))
	if err != nil {
		return fmt.Errorf("%s: %w", envProcN, err)
	}
	var d [4]time.Duration
	for i, env := range []string{envProcTTL, envProcPoll, envProcEvery, envProcHold} {
		if d[i], err = time.ParseDuration(os.Getenv(env)); err != nil {
			return fmt.Errorf("%s: %w", env, err)
		}
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = id
	pcfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The Store has a pool of its own, so that the group's reads, the
	// shards' acquisitions and the renewals never queue behind the owners'
	// writes: with one pool of 8 for both, at load 40–60, the writes kept
	// every connection busy and a takeover waited seconds for connections
	// (TestProcChaos's breakdown).
	spool := pool
	if os.Getenv(envProcSharedPool) == "" {
		scfg := pcfg.Copy()
		scfg.MaxConns = 8
		if spool, err = pgxpool.NewWithConfig(ctx, scfg); err != nil {
			return err
		}
		defer spool.Close()
	}
	level := slog.LevelWarn
	if os.Getenv(envProcDebug) != "" {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{Level: level}))
	store, err := lease.New(spool, lease.Config{Hostname: id, Logger: logger})
	if err != nil {
		return err
	}
	m, err := shard.New(shard.Config{Group: procGroup, Shards: procShards(n), Store: store, Identity: id,
		TTL: d[0], PollInterval: d[1], Logger: logger})
	if err != nil {
		return err
	}
	w := &procWriter{pool: pool, id: id, every: d[2], hold: d[3]}
	w.quietOnSignals()
	go tracePool(ctx, logger, spool)
	fmt.Println("READY")
	err = m.Run(ctx, w.work)
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return errors.Join(err, store.Close(cctx))
}

// procShards names n shards "0" … "n-1".
func procShards(n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = strconv.Itoa(i)
	}
	return s
}

// procWriter is a member process's owner function and its fenced writes.
type procWriter struct {
	pool  *pgxpool.Pool
	id    string
	every time.Duration
	hold  time.Duration // work done between the Guard and the write, the row locked
	quiet atomic.Bool
}

// quietOnSignals pauses the writes on SIGUSR1 and resumes them on
// SIGUSR2. The goroutine ends with the process.
func (w *procWriter) quietOnSignals() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		for s := range sig {
			w.quiet.Store(s == syscall.SIGUSR1)
		}
	}()
}

// work is the owner function: a fenced write when the term starts, then
// one every `every` on average (jittered, so that a member's owners do not
// write in step) until the term's Context ends; then one more, as a stale
// owner acting late would — a paused process resumed, say. That one must
// be refused unless the term is still held (given up, not yet released).
func (w *procWriter) work(ctx context.Context, s shard.Shard) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if !w.quiet.Load() {
				lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
				w.write(lctx, s, true)
				cancel()
			}
			return
		case <-t.C:
		}
		if !w.quiet.Load() {
			w.write(ctx, s, false)
		}
		t.Reset(w.every/2 + rand.N(w.every))
	}
}

// write makes one fenced write and prints what became of it unless it
// committed in time: REFUSED by the term's own clock ("local": the term
// had ended here) or by the Guard's statement ("server": the row was no
// longer this term's while the term was still trusted here), LATE
// committed (the late write of a term still held), or WERR.
func (w *procWriter) write(ctx context.Context, s shard.Shard, late bool) {
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if err := s.Guard(ctx, tx); err != nil {
			return err
		}
		if w.hold > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(w.hold):
			}
		}
		_, err := tx.Exec(ctx, procInsertSQL, s.Name, s.Token, w.id, s.Lease().Owner().String(), procGroup+"#s:"+s.Name, late)
		return err
	})
	kind := map[bool]string{false: "write", true: "late"}[late]
	switch {
	case err == nil:
		if late {
			fmt.Println("LATE committed", s.Name, s.Token)
		}
	case errors.Is(err, lease.ErrNotHeld):
		by := "local"
		if s.Lease().Err() == nil {
			by = "server"
		}
		fmt.Println("REFUSED", kind, by, s.Name, s.Token)
	case ctx.Err() != nil:
		// The term ended during the write: its outcome does not matter
		// here; the checker judges what committed.
	default:
		fmt.Println("WERR", kind, s.Name, s.Token, strings.ReplaceAll(err.Error(), "\n", " "))
	}
}

// tracePool logs, at Debug, the Store's pool's connections in use and the
// total time acquisitions waited for one, every 250 ms until ctx ends.
func tracePool(ctx context.Context, logger *slog.Logger, pool *pgxpool.Pool) {
	if !logger.Enabled(ctx, slog.LevelDebug) {
		return
	}
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st := pool.Stat()
		logger.Debug("pool", "acquired", st.AcquiredConns(), "max", st.MaxConns(), "waited_ms", st.EmptyAcquireWaitTime().Milliseconds())
	}
}
