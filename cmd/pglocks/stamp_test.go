//go:build linux

package main_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/pgtest"
)

func init() { helpers["stamper"] = stamper }

// stamper is a job's worker that the tests time to the microsecond: it
// leaves the job's process group and session (setsid), writes its pid to
// os.Args[2], then writes the wall-clock time (Unix nanoseconds) over and
// over at the start of os.Args[1], about every 100µs, for ever. With
// PGLOCKS_STAMPER_TERM=ignore it ignores SIGTERM. The last stamp in the
// file is, within that period, when it last ran.
func stamper() int {
	if _, err := unix.Setsid(); err != nil {
		return 1
	}
	if os.Getenv("PGLOCKS_STAMPER_TERM") == "ignore" {
		signal.Ignore(unix.SIGTERM)
	}
	f, err := os.OpenFile(os.Args[1], os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return 1
	}
	if err := os.WriteFile(os.Args[2], []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return 1
	}
	for {
		if _, err := f.WriteAt(fmt.Appendf(nil, "%019d\n", time.Now().UnixNano()), 0); err != nil {
			return 1
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// stamperScript is a job that starts a stamper (the test binary, $3;
// $4 is "ignore" for one that ignores SIGTERM) writing to $1 (its pid to
// $2) and $5 more processes in its own process group, and waits.
const stamperScript = `PGLOCKS_TEST_HELPER=stamper PGLOCKS_STAMPER_TERM="$4" "$3" "$1" "$2" </dev/null >/dev/null 2>&1 &
i=0; while [ "$i" -lt "$5" ]; do sleep 3600 & i=$((i+1)); done
while [ ! -s "$2" ]; do sleep 0.01; done
echo ready
wait
`

// stamped is a stamper's files.
type stamped struct{ stamps, pid string }

func newStamped(t *testing.T) stamped {
	dir := t.TempDir()
	return stamped{stamps: dir + "/stamps", pid: dir + "/pid"}
}

// argv is CMD running stamperScript: a stamper that ignores SIGTERM if
// ignoreTerm, and extra more processes.
func (s stamped) argv(t *testing.T, ignoreTerm bool, extra int) []string {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	term := ""
	if ignoreTerm {
		term = "ignore"
	}
	return []string{"sh", "-c", stamperScript, "job", s.stamps, s.pid, self, term, strconv.Itoa(extra)}
}

// last returns the stamper's latest stamp (false if none was written
// whole yet).
func (s stamped) last() (time.Time, bool) {
	b, err := os.ReadFile(s.stamps)
	if err != nil {
		return time.Time{}, false
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || ns == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, ns), true
}

// started waits for the stamper's first stamp and returns its watcher.
func (s stamped) started(t *testing.T) *worker {
	t.Helper()
	w := watchWorker(t, s.pid)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, ok := s.last(); ok {
			return w
		}
		if time.Now().After(deadline) {
			t.Fatal("the stamper wrote no stamp in 30s")
		}
		tick := time.NewTimer(10 * time.Millisecond)
		<-tick.C
	}
}

// finalStamp waits up to bound for the stamper to die and returns its
// last stamp; it fails the test if it still runs then.
func (s stamped) finalStamp(t *testing.T, w *worker, bound time.Duration, what string) time.Time {
	t.Helper()
	if !w.exitedBy(time.Now().Add(bound)) {
		last, _ := s.last()
		t.Fatalf("the job's worker still runs %v after %s (its latest stamp: %s)", bound, what, last.Format(time.RFC3339Nano))
	}
	last, ok := s.last()
	if !ok {
		t.Fatal("the stamper's file holds no stamp")
	}
	return last
}

// lockWaiter is another session waiting in pg_advisory_lock for the key of
// a name: got receives the server's clock_timestamp() once it has the
// lock (taken just after the grant, in the same statement).
type lockWaiter struct {
	got chan time.Time
	err chan error
}

func waitForLock(t *testing.T, db *pgtest.DB, name string) *lockWaiter {
	t.Helper()
	conn := db.Conn(t)
	w := &lockWaiter{got: make(chan time.Time, 1), err: make(chan error, 1)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	go func() {
		var at time.Time
		err := conn.QueryRow(ctx, `select clock_timestamp() from (select pg_advisory_lock($1) offset 0) s`,
			pglocks.KeyOf(name).Int64()).Scan(&at)
		if err != nil {
			w.err <- err
			return
		}
		w.got <- at
	}()
	admin := db.Conn(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		err := admin.QueryRow(ctx, `select count(*) from pg_locks where locktype = 'advisory' and not granted
			and database = (select oid from pg_database where datname = current_database())`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return w
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter is not waiting for the lock after 30s")
		}
		tick := time.NewTimer(10 * time.Millisecond)
		<-tick.C
	}
}

// granted returns when the waiter got the lock, by the server's clock.
func (w *lockWaiter) granted(t *testing.T, within time.Duration) time.Time {
	t.Helper()
	select {
	case at := <-w.got:
		return at
	case err := <-w.err:
		t.Fatalf("the waiting session: %v", err)
	case <-time.After(within):
		t.Fatalf("the waiting session did not get the lock in %v", within)
	}
	return time.Time{}
}
