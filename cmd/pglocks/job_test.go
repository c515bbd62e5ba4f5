//go:build linux

package main_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pglocks/pglocks/pgtest"
)

// jobScript is a job whose work is done by a worker it starts in the
// background, writing a line (the time, date +%s%N) every 100 ms: README's
// `-- ./nightly.sh`. $1 is the worker's file, $2 where its pid goes.
const jobScript = `( exec </dev/null >/dev/null 2>&1 # the worker holds none of pglocks' pipes
  while :; do date +%s%N >>"$1"; sleep 0.1; done ) &
echo $! >"$2"
echo ready
wait
`

// escapedScript's worker leaves the job's process group and session
// (setsid) and its parent exits (a double fork): only the supervisor's
// subreaper and its walk of the process tree still find it.
const escapedScript = `( setsid sh -c 'while :; do date +%s%N >>"$1"; sleep 0.1; done' worker "$1" </dev/null >/dev/null 2>&1 &
  echo $! >"$2" )
echo ready
exec sleep 3600
`

// killedBound is how long after a SIGKILL of pglocks the job's worker may
// live in these tests: generous for a loaded machine (it dies within
// milliseconds; the package doc states the figure), and far below
// "forever", what it did before the fix.
const killedBound = 2 * time.Second

// runTrials is how many times each scenario runs: PGLOCKS_RUN_TRIALS (20
// for the figures the package doc quotes), 2 by default.
func runTrials(t *testing.T) int {
	s := os.Getenv("PGLOCKS_RUN_TRIALS")
	if s == "" {
		return 2
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("PGLOCKS_RUN_TRIALS=%q: want a positive number", s)
	}
	return n
}

// TestRunStopsTheWholeJob: when the lock is lost or pglocks is SIGKILLed,
// the job's worker stops too, not only CMD. After a loss, pglocks exits
// 76 only once every process of the job is gone; after a SIGKILL of
// pglocks, the worker dies within killedBound.
func TestRunStopsTheWholeJob(t *testing.T) {
	t.Parallel()
	trials := runTrials(t)
	cases := []struct {
		name   string
		flags  []string
		script string
		killed bool // kill -9 of pglocks; else the lock is lost
	}{
		{"LostAdvisory", nil, jobScript, false},
		{"LostLease", []string{"--lease", "--ttl", "3s"}, jobScript, false},
		{"Killed", nil, jobScript, true},
		{"EscapedLost", nil, escapedScript, false},
		{"EscapedKilled", []string{"--lease", "--ttl", "3s"}, escapedScript, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newJobEnv(t, tc.flags)
			var lastLine, death, exit []time.Duration
			for i := range trials {
				f := e.trial(t, i, tc.script, tc.killed)
				lastLine, death, exit = append(lastLine, f.lastLine), append(death, f.death), append(exit, f.exit)
			}
			t.Logf("%s, %d trials: latest worker line after %s: max %v, median %v; worker's death after it: max %v, median %v",
				tc.name, trials, event(tc.killed), slices.Max(lastLine), median(lastLine), slices.Max(death), median(death))
			if !tc.killed {
				t.Logf("%s: pglocks exited 76 after the loss (terminate or break done): max %v, median %v",
					tc.name, slices.Max(exit), median(exit))
			}
		})
	}
}

// jobEnv is a database with pglocks run's flags for one scenario.
type jobEnv struct {
	c     cli
	db    *pgtest.DB
	flags []string
	lease bool
}

func newJobEnv(t *testing.T, flags []string) jobEnv {
	db := pgtest.New(t)
	e := jobEnv{c: cli{t: t, dsn: db.DSN}, db: db, flags: flags, lease: slices.Contains(flags, "--lease")}
	if e.lease {
		if _, errOut, code := e.c.run("migrate"); code != 0 {
			t.Fatalf("migrate: %d %s", code, errOut)
		}
	}
	return e
}

// figures are one trial's: the latest worker line and the worker's death,
// after pglocks exited 76 (a loss) or was SIGKILLed; after a loss, how
// long pglocks took to exit (to notice the loss and stop the job).
type figures struct{ lastLine, death, exit time.Duration }

// trial runs the job, loses the lock or kills pglocks once the worker is
// writing, and checks that the worker is gone in time.
func (e jobEnv) trial(t *testing.T, i int, script string, killed bool) figures {
	t.Helper()
	dir := t.TempDir()
	lines, pidFile := filepath.Join(dir, "lines"), filepath.Join(dir, "pid")
	name := fmt.Sprintf("job-%d", i)
	args := append(append([]string{"run", "--kill-after", "5s"}, e.flags...), name)
	h := e.c.holdArgv(args, "sh", "-c", script, "job", lines, pidFile)
	w := watchWorker(t, pidFile)
	waitLines(t, lines, 2)
	var at time.Time
	var exit time.Duration
	bound := time.Duration(0) // a loss: pglocks exits once the job is gone
	if killed {
		bound = killedBound
		if err := h.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		at = time.Now()
	} else {
		e.loseLock(t, name)
		lost := time.Now()
		if code := h.wait(t); code != 76 {
			t.Fatalf("trial %d: status %d after the lock was lost, want 76", i, code)
		}
		at = time.Now()
		exit = at.Sub(lost)
	}
	if !w.exitedBy(at.Add(bound)) {
		w.exitedBy(at.Add(bound + time.Second)) // let it show how it goes on
		n, _ := linesAfter(t, lines, at)
		t.Fatalf("trial %d: the job's worker was still running %v after %s, and wrote %d lines after it (in %v)",
			i, bound, event(killed), n, time.Since(at).Round(time.Millisecond))
	}
	n, last := linesAfter(t, lines, at.Add(bound))
	if n > 0 {
		t.Fatalf("trial %d: the worker wrote %d lines later than %v after %s", i, n, bound, event(killed))
	}
	if killed {
		h.wait(t) // pglocks reaped; CMD's stdout closed
	}
	return figures{lastLine: last.Sub(at), death: w.diedAt().Sub(at), exit: exit}
}

func event(killed bool) string {
	if killed {
		return "the kill -9 of pglocks"
	}
	return "pglocks exited 76"
}

// loseLock takes the lock away from its holder: pg_terminate_backend of
// the session holding the advisory lock, or pglocks break of the lease.
func (e jobEnv) loseLock(t *testing.T, name string) {
	t.Helper()
	if e.lease {
		if out, errOut, code := e.c.run("break", name); code != 0 {
			t.Fatalf("break %s: %d %q %q", name, code, out, errOut)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var pid uint32
	err := e.db.Conn(t).QueryRow(ctx, `select pid from pg_locks where locktype = 'advisory' and granted
		and database = (select oid from pg_database where datname = current_database())`).Scan(&pid)
	if err != nil {
		t.Fatalf("the lock's session: %v", err)
	}
	if err := e.db.Server.TerminateBackend(ctx, pid); err != nil {
		t.Fatal(err)
	}
}

// worker watches the job's worker through a pidfd (readable once it has
// exited) and SIGKILLs it when the test ends, should it still run.
type worker struct {
	fd   int
	died chan struct{}
	at   time.Time // when the watcher saw it die; set before died closes
}

func watchWorker(t *testing.T, pidFile string) *worker {
	t.Helper()
	b, err := os.ReadFile(pidFile) // written before CMD said ready
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("worker pid %q: %v", b, err)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd of the worker %d: %v", pid, err)
	}
	w := &worker{fd: fd, died: make(chan struct{})}
	go func() {
		w.poll(-1)
		w.at = time.Now()
		close(w.died)
	}()
	t.Cleanup(func() {
		_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		<-w.died
		unix.Close(fd)
	})
	return w
}

// poll waits up to ms milliseconds (-1: for ever) for the worker to exit
// and reports whether it has.
func (w *worker) poll(ms int) bool {
	for {
		fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n > 0
	}
}

// exitedBy reports whether the worker has exited by the deadline (at
// once if it has passed: the kernel's answer, not the watcher's).
func (w *worker) exitedBy(deadline time.Time) bool {
	return w.poll(int(max(0, time.Until(deadline).Milliseconds())))
}

// diedAt is when the watcher saw the worker die.
func (w *worker) diedAt() time.Time {
	<-w.died
	return w.at
}

// waitLines waits until the worker has written n lines.
func waitLines(t *testing.T, path string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if strings.Count(string(b), "\n") >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker wrote %q in 30s, want %d lines", b, n)
		}
		tick := time.NewTimer(20 * time.Millisecond)
		<-tick.C
	}
}

// linesAfter counts the worker's lines stamped after at, and returns the
// latest stamp.
func linesAfter(t *testing.T, path string, at time.Time) (int, time.Time) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, last := 0, time.Time{}
	for _, line := range strings.Fields(string(b)) {
		ns, err := strconv.ParseInt(line, 10, 64)
		if err != nil {
			continue // a line being written as the worker died
		}
		stamp := time.Unix(0, ns)
		if stamp.After(at) {
			n++
		}
		if stamp.After(last) {
			last = stamp
		}
	}
	return n, last
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}
