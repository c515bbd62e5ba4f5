package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/pgtest"
)

// cluster is one run's workers, each behind a proxy of its own, and the
// server they share.
type cluster struct {
	t     *testing.T
	db    *pgtest.DB // nil on a Patroni cluster
	admin *pgxpool.Pool
	dir   string
	env   []string        // extra environment of every worker
	ha    *pgtest.Cluster // the run's primary and standby, if it has them
	pat   *patroniRun     // the run's Patroni cluster and its faults, if on one

	mu      sync.Mutex
	slots   []*slot
	stopped sync.WaitGroup // SIGCONT timers in flight
}

// adminApp is the application_name of the harness's own sessions; every
// other session in the run's database is a worker's.
const adminApp = "chaos-admin"

// adminPool opens a pool whose sessions the checks do not count as a
// worker's.
func adminPool(t *testing.T, db *pgtest.DB) *pgxpool.Pool {
	return db.NewPool(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.RuntimeParams["application_name"] = adminApp })
}

// slot is one worker position; a killed worker is replaced in its slot by
// a new incarnation with a new worker number.
type slot struct {
	proxy *pgtest.Proxy
	dsn   string
	inc   int
	cmd   *exec.Cmd
	done  chan struct{}
}

// newCluster starts the workers of a run on tg. On a cluster (ha or pat)
// the workers connect through a DSN that follows a failover (a multi-host
// DSN, or HAProxy), and have no proxies (no lost-reply or partition
// faults).
func newCluster(t *testing.T, tg target, workers int, env ...string) *cluster {
	c := &cluster{t: t, db: tg.db, ha: tg.ha, pat: tg.pat, admin: tg.admin, dir: t.TempDir(), env: env}
	for i := range workers {
		switch {
		case tg.pat != nil:
			c.slots = append(c.slots, &slot{dsn: tg.pat.workerDSN(i)})
		case tg.ha != nil:
			c.slots = append(c.slots, &slot{dsn: tg.db.DSN})
		default:
			var opts []pgtest.ProxyOption
			if tg.db.Server.Mode() == pgtest.ModeLocal {
				opts = append(opts, pgtest.Partitionable()) // partition faults need it
			}
			p, dsn := tg.db.Proxy(t, opts...)
			c.slots = append(c.slots, &slot{proxy: p, dsn: dsn})
		}
	}
	for i := range c.slots {
		if err := c.spawn(i); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// spawn starts the next incarnation of slot i. Callers hold no lock.
func (c *cluster) spawn(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.slots[i]
	p := i + 1000*s.inc
	s.inc++
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), c.env...)
	cmd.Env = append(cmd.Env, envWorker+"="+fmt.Sprint(p), envDSN+"="+s.dsn,
		envOut+"="+filepath.Join(c.dir, fmt.Sprintf("w%d.jsonl", p)))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	return nil
}

// workerPids returns the server pids of the workers' sessions.
func (c *cluster) workerPids(ctx context.Context) ([]uint32, error) {
	rows, err := c.admin.Query(ctx, "select pid from pg_stat_activity where datname = current_database() and application_name <> $1 order by pid", adminApp)
	if err != nil {
		return nil, err
	}
	var pids []uint32
	for rows.Next() {
		var pid uint32
		if err := rows.Scan(&pid); err != nil {
			return nil, err
		}
		pids = append(pids, pid)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(pids) == 0 {
		return nil, errors.New("no worker session")
	}
	return pids, nil
}

func (c *cluster) terminate(ctx context.Context, pick func(n int) int) error {
	pids, err := c.workerPids(ctx)
	if err != nil {
		return err
	}
	return c.terminateBackend(ctx, pids[pick(len(pids))])
}

// terminateBackend ends the worker session pid and returns once it is
// gone: through pgtest on a server of its own, with pg_terminate_backend
// and its wait on the primary of a Patroni cluster.
func (c *cluster) terminateBackend(ctx context.Context, pid uint32) error {
	if c.db != nil {
		return c.db.Server.TerminateBackend(ctx, pid)
	}
	var ok bool
	if err := c.admin.QueryRow(ctx, "select pg_terminate_backend($1, 5000)", int32(pid)).Scan(&ok); err != nil {
		return fmt.Errorf("terminate backend %d: %w", pid, err)
	}
	if !ok { // the server warned which
		return fmt.Errorf("terminate backend %d: no such backend, or still there after 5 s", pid)
	}
	return nil
}

// termHolder terminates the session of a holder of an advisory lock —
// with the semaphore workload, a permit's — or, when none holds one, any
// worker session.
func (c *cluster) termHolder(ctx context.Context, pick func(n int) int) error {
	rows, err := c.admin.Query(ctx, `select distinct l.pid from pg_locks l join pg_stat_activity a using (pid)
		where l.locktype = 'advisory' and l.granted and a.application_name <> $1
		and l.database = (select oid from pg_database where datname = current_database()) order by 1`, adminApp)
	if err != nil {
		return err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
	if err != nil {
		return err
	}
	if len(pids) == 0 {
		return c.terminate(ctx, pick)
	}
	return c.terminateBackend(ctx, pids[pick(len(pids))])
}

// crash SIGKILLs the backend of a worker session: the postmaster ends
// every other session and recovers from the WAL on disk, losing whatever
// was committed but not yet written (asynchronous commits). It returns
// once the server answers again. A local server only (a Patroni cluster's
// nodes are): its backends are processes of this machine.
func (c *cluster) crash(ctx context.Context, pick func(n int) int) error {
	if c.db != nil && c.db.Server.Mode() != pgtest.ModeLocal {
		return fmt.Errorf("crash needs a local server, have %s", c.db.Server.Mode())
	}
	if c.pat != nil {
		if !c.pat.busy.TryLock() {
			return errors.New("skipped: a Patroni fault is under way")
		}
		defer c.pat.busy.Unlock()
	}
	pids, err := c.workerPids(ctx)
	if err != nil {
		return err
	}
	if err := syscall.Kill(int(pids[pick(len(pids))]), syscall.SIGKILL); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	// The admin pool's sessions die too: drop them all (a dead idle one
	// would fail the next check with an unexpected EOF); a ping fails
	// until a new one connects after the recovery.
	c.admin.Reset()
	for c.admin.Ping(ctx) != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		pause(ctx, 50*time.Millisecond)
	}
	if c.pat != nil {
		return c.pat.waitStreaming(ctx, c.admin)
	}
	return nil
}

func (c *cluster) kill(i int) error {
	c.mu.Lock()
	s := c.slots[i]
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a stopped worker dies too
	err := s.cmd.Process.Kill()
	done := s.done
	c.mu.Unlock()
	if err != nil {
		return err
	}
	<-done
	return c.spawn(i)
}

func (c *cluster) stop(i int, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	proc := c.slots[i].cmd.Process
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	c.stopped.Add(1)
	time.AfterFunc(d, func() {
		defer c.stopped.Done()
		_ = proc.Signal(syscall.SIGCONT)
	})
	return nil
}

func (c *cluster) lostReply(i int, d time.Duration) error {
	p := c.slots[i].proxy
	if p == nil {
		return errors.New("no proxy in a run on a cluster")
	}
	p.DropReplies()
	c.stopped.Add(1)
	time.AfterFunc(d, func() {
		defer c.stopped.Done()
		p.Pass()
	})
	return nil
}

// promote fails the run's cluster over — the primary stopped at once, the
// synchronous standby promoted — and makes the old primary the new
// standby, so that the next promotion can follow.
func (c *cluster) promote(ctx context.Context) error {
	if c.ha == nil {
		return errors.New("promote needs a run on a cluster")
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if _, err := c.ha.Promote(ctx); err != nil {
		return err
	}
	return c.ha.Rejoin(ctx)
}

// cutShort makes commits that a promotion loses although other sessions
// saw them: replication paused, so every commit waits for the standby;
// for a second, the worker sessions waiting are terminated, which leaves
// their commits committed on the primary alone, and visible; a moment for
// other sessions to see them; then a promotion
// of the standby, which never received them (lease TestSyncCommitCutShort).
// The terminated sessions' callers got no answer: unknown outcomes.
func (c *cluster) cutShort(ctx context.Context) error {
	if c.ha == nil {
		return errors.New("cutshort needs a run on a cluster")
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if err := c.ha.PauseReplication(ctx); err != nil {
		return err
	}
	for end := time.Now().Add(time.Second); time.Now().Before(end); pause(ctx, 20*time.Millisecond) {
		pids, err := c.syncWaiters(ctx)
		if err != nil {
			// Leave no commit waiting for a standby that will not answer.
			return errors.Join(err, c.ha.ResumeReplication(ctx))
		}
		for _, pid := range pids {
			// Gone already (its process killed, say): nothing to cut short.
			_ = c.terminateBackend(ctx, pid)
		}
	}
	pause(ctx, 300*time.Millisecond)
	return c.promote(ctx)
}

// syncWaiters returns the server pids of the worker sessions whose commits
// wait for the synchronous standby.
func (c *cluster) syncWaiters(ctx context.Context) ([]uint32, error) {
	rows, err := c.admin.Query(ctx, `select pid from pg_stat_activity where datname = current_database()
		and application_name <> $1 and wait_event = 'SyncRep'`, adminApp)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[uint32])
}

// partition cuts slot i's worker off from the server, both ways, for d:
// packets are dropped (a real partition, see pgtest.Proxy.Partition).
func (c *cluster) partition(i int, d time.Duration) error {
	p := c.slots[i].proxy
	if p == nil {
		return errors.New("no proxy in a run on a cluster")
	}
	if err := p.Partition(); err != nil {
		return err
	}
	c.stopped.Add(1)
	time.AfterFunc(d, func() {
		defer c.stopped.Done()
		_ = p.Heal()
	})
	return nil
}

// restart restarts the server; the end of the run does not interrupt it
// (a server left down would fail the checks that follow).
func (c *cluster) restart(ctx context.Context) error {
	if c.db == nil {
		return errors.New("restart needs a pgtest server (on Patroni: kill-postmaster)")
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	err := c.db.Server.Restart(ctx)
	c.admin.Reset() // its sessions died with the server
	return err
}

// shutdown ends every worker gracefully (SIGTERM; SIGKILL after a minute)
// once the fault timers have run out.
func (c *cluster) shutdown() {
	c.stopped.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.slots {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
	}
	for i, s := range c.slots {
		select {
		case <-s.done:
		case <-time.After(time.Minute):
			// SIGQUIT first: the Go runtime prints every goroutine's stack
			// on the worker's stderr (the test's), then exits.
			c.t.Errorf("worker in slot %d did not exit within a minute of SIGTERM: SIGQUIT (stacks above), then killed", i)
			_ = s.cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-s.done:
			case <-time.After(10 * time.Second):
				_ = s.cmd.Process.Kill()
				<-s.done
			}
		}
	}
}

// history reads every worker's events.
func (c *cluster) history() []event {
	files, err := filepath.Glob(filepath.Join(c.dir, "w*.jsonl"))
	if err != nil {
		c.t.Fatal(err)
	}
	var all []event
	for _, f := range files {
		evs, err := readEvents(f)
		if err != nil {
			c.t.Fatal(err)
		}
		all = append(all, evs...)
	}
	return all
}

// returned counts the operations that have returned so far: those
// whose return names op, or every one for op "".
func (c *cluster) returned(op string) int {
	n := 0
	for _, e := range c.history() {
		if e.K == evRet && (op == "" || e.Op == op) {
			n++
		}
	}
	return n
}
