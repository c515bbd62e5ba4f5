// Command leader shows leader election on PostgreSQL: three replicas —
// separate processes — campaign in one election, the leader is killed with
// SIGKILL, and another replica takes over in about a second, in a higher term.
//
//	go run ./examples/leader
//
// It runs on a throwaway PostgreSQL; with -dsn URL it runs in a schema of
// its own in that database (its lease table), dropped at the end. The
// replicas are this program itself, started again with
// PGLOCKS_EXAMPLE_REPLICA set (and the database in
// PGLOCKS_EXAMPLE_REPLICA_DSN and _SCHEMA); the parent watches the election through
// [leader.Elector.Observe] and kills the process whose PID the leader's lease
// records.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglocks/pglocks/examples/internal/exampledb"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
)

const (
	election = "examples/leader"
	// replicaEnv names the replica a re-executed process should be;
	// replicaDSNEnv and replicaSchemaEnv its database.
	replicaEnv       = "PGLOCKS_EXAMPLE_REPLICA"
	replicaDSNEnv    = replicaEnv + "_DSN"
	replicaSchemaEnv = replicaEnv + "_SCHEMA"
	replicas         = 3
)

func main() {
	if id := os.Getenv(replicaEnv); id != "" {
		replicaMain(id)
		return
	}
	exampledb.Main(run)
}

// failover is what run saw.
type failover struct {
	First, Next leader.Leader
	// Took is the time from the kill to the new leader's term.
	Took time.Duration
	// Killed is the exit state of the killed leader's process.
	Killed *os.ProcessState
	// End is the election's state after the other replicas stopped.
	End leader.Leader
}

func describe(l leader.Leader) string {
	if l.Held {
		return fmt.Sprintf("%s still leads, term %d", l.Identity, l.Term)
	}
	return fmt.Sprintf("term %d resigned, no leader now", l.Term)
}

// run starts the replicas, kills the first leader and reports the failover.
func run(ctx context.Context, db exampledb.Target, out io.Writer) (res failover, err error) {
	pool, err := pgxpool.New(ctx, db.DSN)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	store, err := lease.New(pool, lease.Config{Schema: db.Schema})
	if err != nil {
		return res, err
	}
	defer store.Close(context.WithoutCancel(ctx))
	if err := store.Migrate(ctx); err != nil {
		return res, err
	}

	// An elector that never runs is an observer: it streams the state of
	// the election without campaigning.
	observer, err := leader.New(leader.Config{Name: election, Pool: pool, Store: store})
	if err != nil {
		return res, err
	}
	defer observer.Close(context.WithoutCancel(ctx))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	changes := observer.Observe(ctx)

	procs, err := startReplicas(db)
	defer func() { err = errors.Join(err, procs.stop()) }()
	if err != nil {
		return res, err
	}
	fmt.Fprintf(out, "%d replicas campaign for %q: %s\n", replicas, election, procs)

	res.First, err = await(ctx, changes, func(l leader.Leader) bool { return procs.byPID(l.PID) != nil })
	if err != nil {
		return res, fmt.Errorf("waiting for a leader: %w", err)
	}
	fmt.Fprintf(out, "%s leads, term %d\n", res.First.Identity, res.First.Term)

	victim := procs.byPID(res.First.PID)
	killed := time.Now()
	if err := victim.Process.Kill(); err != nil { // SIGKILL: no goodbye, no release
		return res, err
	}
	fmt.Fprintf(out, "kill -9 %s (pid %d)\n", res.First.Identity, res.First.PID)

	res.Next, err = await(ctx, changes, func(l leader.Leader) bool { return l.Term > res.First.Term })
	if err != nil {
		return res, fmt.Errorf("waiting for a new leader: %w", err)
	}
	res.Took = time.Since(killed)
	// The term jumps by two: the new leader broke the dead leader's lease
	// (one token) before taking it (another).
	fmt.Fprintf(out, "%s leads, term %d: failover took %v\n",
		res.Next.Identity, res.Next.Term, res.Took.Round(time.Millisecond))

	_ = victim.Wait() // reap it; its status says how it died
	res.Killed = victim.ProcessState

	// The others stop gracefully: the leader resigns, releasing its lease.
	if err := procs.stop(); err != nil {
		return res, err
	}
	if res.End, err = observer.Leader(ctx); err != nil {
		return res, err
	}
	fmt.Fprintf(out, "stopped the others: %s\n", describe(res.End))
	return res, nil
}

// await returns the first state of the election, held by a leader, that ok
// accepts. It gives up after 30 seconds.
func await(ctx context.Context, changes <-chan leader.Leader, ok func(leader.Leader) bool) (leader.Leader, error) {
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, open := <-changes:
			if !open {
				return l, ctx.Err()
			}
			if l.Held && ok(l) {
				return l, nil
			}
		case <-timeout:
			return leader.Leader{}, errors.New("timed out")
		}
	}
}

// replicaSet is the replica processes.
type replicaSet []replicaProc

type replicaProc struct {
	*exec.Cmd
	stdin io.Closer
}

// startReplicas starts the replica processes. Each gets a pipe as stdin:
// closing it (or the parent's death) stops the replica.
func startReplicas(db exampledb.Target) (replicaSet, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var procs replicaSet
	for i := 1; i <= replicas; i++ {
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=replica-%d", replicaEnv, i),
			replicaDSNEnv+"="+db.DSN, replicaSchemaEnv+"="+db.Schema)
		cmd.Stderr = os.Stderr // for errors; replicas print nothing else
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return procs, err
		}
		if err := cmd.Start(); err != nil {
			return procs, err
		}
		procs = append(procs, replicaProc{cmd, stdin})
	}
	return procs, nil
}

func (ps replicaSet) byPID(pid int) *exec.Cmd {
	for _, p := range ps {
		if p.Process.Pid == pid {
			return p.Cmd
		}
	}
	return nil
}

func (ps replicaSet) String() string {
	var s []string
	for i, p := range ps {
		s = append(s, fmt.Sprintf("replica-%d (pid %d)", i+1, p.Process.Pid))
	}
	return strings.Join(s, ", ")
}

// stop asks the replicas still running to stop, by closing their stdin, and
// waits for them; one that does not exit within ten seconds is killed. The
// error reports a replica that failed (the killed leader aside).
func (ps replicaSet) stop() error {
	for _, p := range ps {
		_ = p.stdin.Close()
	}
	var errs []error
	for _, p := range ps {
		if p.ProcessState != nil {
			continue
		}
		timer := time.AfterFunc(10*time.Second, func() { _ = p.Process.Kill() })
		if err := p.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("replica pid %d: %w", p.Process.Pid, err))
		}
		timer.Stop()
	}
	return errors.Join(errs...)
}

// replicaMain is the whole of a replica process: it campaigns until its stdin
// closes or it is told to stop, and leads while elected.
func replicaMain(id string) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin) // EOF: the parent stopped us or died
		cancel()
	}()
	db := exampledb.Target{DSN: os.Getenv(replicaDSNEnv), Schema: os.Getenv(replicaSchemaEnv)}
	if err := replica(ctx, id, db); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", id, err)
		os.Exit(1)
	}
}

func replica(ctx context.Context, id string, db exampledb.Target) error {
	pool, err := pgxpool.New(ctx, db.DSN)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := lease.New(pool, lease.Config{Schema: db.Schema})
	if err != nil {
		return err
	}
	defer store.Close(context.WithoutCancel(ctx))
	elector, err := leader.New(leader.Config{Name: election, Pool: pool, Identity: id, Store: store})
	if err != nil {
		return err
	}
	defer elector.Close(context.WithoutCancel(ctx))
	return elector.Run(ctx, func(ctx context.Context, term leader.Term) error {
		// The leader's work goes here; it must stop when ctx ends, and
		// fence its writes with term.Guard.
		<-ctx.Done()
		return nil
	})
}
