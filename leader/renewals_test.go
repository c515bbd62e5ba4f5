package leader_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
)

// stmtCounter is a pgx tracer that counts the statements a pool sends, and
// those that renew leases (one or a batch).
type stmtCounter struct{ all, renew atomic.Int64 }

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.all.Add(1)
	if strings.Contains(data.SQL, "set renewed_at") {
		c.renew.Add(1)
	}
	return ctx
}

func (c *stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestManyElectionsRenewBatched: elections sharing a lease Store renew
// their terms in the Store's batched keep-alive, not one statement per
// leader: n elections at rest (TTL 3 s, renewed every second) send at most
// two renewal statements per renewal interval — term leases and candidate
// rows, which may fall into separate rounds — however many there are, and
// every leader stays elected. It logs, over the window, the renewal and
// all statements per second the process sent (counted by a tracer on its
// pool), the database's commits per second (pg_stat_database.xact_commit,
// which also counts the advisory sessions' pings) and the server's CPU
// (utime + stime of the postmaster's children, where /proc shows them).
// PGLOCKS_STRESS=1 runs 1,000 elections over a 20 s window; the default is
// 50 over 4 s.
func TestManyElectionsRenewBatched(t *testing.T) {
	t.Parallel()
	n, window := 50, 4*time.Second
	if os.Getenv("PGLOCKS_STRESS") != "" {
		n, window = 1000, 20*time.Second
	}
	const ttl, every = 3 * time.Second, time.Second
	db := setup(t)
	c := &stmtCounter{}
	pool := db.NewPool(t, func(cfg *pgxpool.Config) { cfg.MaxConns, cfg.ConnConfig.Tracer = 8, c })
	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var elected, demoted atomic.Int64
	allIn := make(chan struct{})
	runs := make(chan error, n)
	for i := range n {
		e, err := leader.New(leader.Config{Name: fmt.Sprintf("batched-%d", i), Pool: pool, Locker: locker, Store: store,
			TTL: ttl, RenewInterval: every})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			runs <- e.Run(ctx, func(ctx context.Context, term leader.Term) error {
				if elected.Add(1) == int64(n) {
					close(allIn)
				}
				<-ctx.Done()
				if errors.Is(context.Cause(ctx), leader.ErrLost) {
					demoted.Add(1)
				}
				return nil
			})
		}()
	}
	select {
	case <-allIn:
	case <-time.After(2 * time.Minute):
		t.Fatalf("only %d of %d elections elected a leader", elected.Load(), n)
	}
	mctx := ctxT(t, time.Minute)
	conn := db.Conn(t)
	commits0, cpu0 := xactCommits(t, mctx, conn), serverCPU(mctx, conn)
	renew0, all0, start := c.renew.Load(), c.all.Load(), time.Now()
	timer := time.NewTimer(window) // the window is the measurement: nothing waits on it
	<-timer.C
	el := time.Since(start)
	renewals, stmts := c.renew.Load()-renew0, c.all.Load()-all0
	commits, cpu1 := xactCommits(t, mctx, conn)-commits0, serverCPU(mctx, conn)
	perSec := func(v int64) float64 { return float64(v) / el.Seconds() }
	t.Logf("%d elections at rest, TTL %v, renewed every %v, over %v: %.2f renewal statements/s (%.2f per renewal interval), %.1f statements/s from the process, %.1f commits/s in the database",
		n, ttl, every, el.Round(time.Millisecond), perSec(renewals), perSec(renewals)*every.Seconds(), perSec(stmts), perSec(commits))
	if cpu0 >= 0 && cpu1 >= 0 {
		t.Logf("server CPU (postmaster's children): %.1f%% of one core", 100*float64(cpu1-cpu0)/float64(el))
	}
	if limit := 2 * (int64(el/every) + 1); renewals > limit {
		t.Errorf("%d renewal statements in %v for %d elections: more than %d, not batched", renewals, el, n, limit)
	}
	if d := demoted.Load(); d > 0 {
		t.Errorf("%d leaders lost their terms at rest", d)
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

// xactCommits returns the database's committed transactions, as the
// statistics show them now.
func xactCommits(t *testing.T, ctx context.Context, conn *pgx.Conn) int64 {
	t.Helper()
	var v int64
	if _, err := conn.Exec(ctx, "select pg_stat_clear_snapshot()"); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "select xact_commit from pg_stat_database where datname = current_database()").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// serverCPU returns the CPU time (user + system) the server's processes
// other than the postmaster have used, read from /proc; -1 where the
// server is not a local process this one can see.
func serverCPU(ctx context.Context, conn *pgx.Conn) time.Duration {
	var pid int
	if err := conn.QueryRow(ctx, "select pg_backend_pid()").Scan(&pid); err != nil {
		return -1
	}
	st, err := procStat(pid)
	if err != nil {
		return -1
	}
	postmaster := st[1]
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var ticks int64
	for _, d := range dirs {
		p, _ := strconv.Atoi(filepath.Base(d))
		f, err := procStat(p)
		if err != nil || f[1] != postmaster {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * (time.Second / 100) // USER_HZ is 100 on Linux
}

// procStat returns the fields of /proc/pid/stat after the command: [0] is
// the state, [1] the parent's pid, [11] utime and [12] stime.
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return nil, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	return f, nil
}

// TestBatchedTermLostAlone: a term renewed in its Store's batch is still
// lost on its own when its row did not renew. Of n elections sharing a
// Store, one's lease row is deleted by hand (no NOTIFY announces it): the
// batch does not renew it, the keep-alive finds it gone, and that leader
// alone is demoted with ErrLost wrapping lease.ErrNotHeld (the server's
// answer, not a passed trust deadline), while every other leader keeps
// its term through the next round.
func TestBatchedTermLostAlone(t *testing.T) {
	t.Parallel()
	const n, victim = 20, 7
	db := setup(t)
	pool := db.NewPool(t)
	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	store, err := lease.New(pool, lease.Config{CheckInterval: time.Hour}) // only renewals notice
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	type demotion struct {
		i      int
		term   int64
		reason error
	}
	elected, demoted := make(chan int, 2*n), make(chan demotion, 2*n)
	runs := make(chan error, n)
	for i := range n {
		e, err := leader.New(leader.Config{Name: fmt.Sprintf("alone-%d", i), Pool: pool, Locker: locker, Store: store,
			TTL: 6 * time.Second, RetryInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if got := e.Config().RenewInterval; got < 2*time.Second-time.Millisecond || got > 2*time.Second {
			t.Errorf("RenewInterval = %v, want the Store's cadence, TTL/3 = 2s", got)
		}
		go func() {
			runs <- e.Run(ctx, func(ctx context.Context, term leader.Term) error {
				elected <- i
				<-ctx.Done()
				demoted <- demotion{i, term.Number, context.Cause(ctx)}
				return nil
			})
		}()
	}
	for range n {
		select {
		case <-elected:
		case <-time.After(time.Minute):
			t.Fatal("not every election elected a leader")
		}
	}
	mctx := ctxT(t, time.Minute)
	deleted := time.Now()
	if _, err := db.Conn(t).Exec(mctx, "delete from pglocks_leases where name = $1", fmt.Sprintf("pglocks.leader:alone-%d", victim)); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-demoted:
		if d.i != victim || !errors.Is(d.reason, leader.ErrLost) || !errors.Is(d.reason, lease.ErrNotHeld) {
			t.Fatalf("election %d demoted (%v); want only %d, with ErrLost and lease.ErrNotHeld", d.i, d.reason, victim)
		}
		t.Logf("the term whose row was deleted was lost %v later: %v", time.Since(deleted).Round(time.Millisecond), d.reason)
	case <-time.After(30 * time.Second):
		t.Fatal("the term whose row was deleted was not lost")
	}
	// Another round of the batch renews every other term, which stays.
	terms := func() map[string]lease.Info {
		infos, err := store.List(mctx)
		if err != nil {
			t.Fatal(err)
		}
		m := make(map[string]lease.Info)
		for _, i := range infos {
			if strings.HasPrefix(i.Name, "pglocks.leader:alone-") && !strings.Contains(i.Name, "#") && i.Held {
				m[i.Name] = i
			}
		}
		return m
	}
	before := terms()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for {
		renewed := 0
		for name, i := range terms() {
			if i.ExpiresAt.After(before[name].ExpiresAt) {
				renewed++
			}
		}
		if renewed >= n-1 {
			break
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("only %d of the %d other terms renewed after the loss", renewed, n-1)
		}
	}
	select {
	case d := <-demoted:
		t.Fatalf("election %d demoted too (%v)", d.i, d.reason)
	default:
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
