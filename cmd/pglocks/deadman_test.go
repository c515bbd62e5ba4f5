//go:build linux

package main_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// stoppedTrials is how many times each TestRunStoppedPglocks scenario
// runs: PGLOCKS_RUN_TRIALS, else 1 (the advisory one takes ~10s).
func stoppedTrials(t *testing.T) int {
	if os.Getenv("PGLOCKS_RUN_TRIALS") == "" {
		return 1
	}
	return runTrials(t)
}

// A pglocks that is stopped (SIGSTOP) or hangs renews nothing: its lease
// expires at the end of its TTL, and the server ends its silent advisory
// session after TCPUserTimeout (10s), freeing the lock. The job must stop
// before then: the supervisor stops it (SIGTERM, then SIGKILL at
// --kill-after) when pglocks' trust deadline passes without being
// extended (a dead-man's switch), and pglocks exits 76 once continued.
// Before, the job's worker ran on while another run held the lock.
func TestRunStoppedPglocks(t *testing.T) {
	t.Parallel()
	t.Run("Lease", func(t *testing.T) {
		t.Parallel()
		e := newJobEnv(t, []string{"--lease", "--ttl", "2s"})
		var margins []time.Duration
		for i := range stoppedTrials(t) {
			name := fmt.Sprintf("stopped-%d", i)
			s := newStamped(t)
			h := e.c.holdArgv([]string{"run", "--lease", "--ttl", "2s", "--kill-after", "1s", name}, s.argv(t, false, 0)...)
			w := s.started(t)
			stop(t, h)
			expiry := e.leaseExpired(t, name)
			last := s.finalStamp(t, w, killedBound, "the lease expired")
			if last.After(expiry) {
				t.Fatalf("trial %d: the job's worker wrote at %v after its lease expired", i, last.Sub(expiry))
			}
			if _, errOut, code := e.c.run("run", "--lease", name, "--", "true"); code != 0 {
				t.Fatalf("another run of %s: status %d %s", name, code, errOut)
			}
			margins = append(margins, expiry.Sub(last))
			resume(t, h)
		}
		t.Logf("%d trials (TTL 2s): the worker's last stamp came before the lease expired by min %v, median %v",
			len(margins), slices.Min(margins), median(margins))
	})
	t.Run("Advisory", func(t *testing.T) {
		t.Parallel()
		e := newJobEnv(t, nil)
		var margins []time.Duration
		for i := range stoppedTrials(t) {
			name := fmt.Sprintf("stopped-%d", i)
			s := newStamped(t)
			h := e.c.holdArgv([]string{"run", "--kill-after", "1s", name}, s.argv(t, false, 0)...)
			w := s.started(t)
			waiter := waitForLock(t, e.db, name)
			stop(t, h)
			got := waiter.granted(t, time.Minute)
			last := s.finalStamp(t, w, killedBound, "the server freed the lock")
			if last.After(got) {
				t.Fatalf("trial %d: the job's worker wrote at %v after another session got the lock", i, last.Sub(got))
			}
			margins = append(margins, got.Sub(last))
			resume(t, h)
		}
		t.Logf("%d trials: the worker's last stamp came before another session got the lock by min %v, median %v",
			len(margins), slices.Min(margins), median(margins))
	})
}

// stop stops pglocks (SIGSTOP) and waits until it is stopped.
func stop(t *testing.T, h *holder) {
	t.Helper()
	pid := h.cmd.Process.Pid
	if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		if p, ok := parseState(b); ok && p == "T" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("pglocks is not stopped 30s after SIGSTOP")
		}
		tick := time.NewTimer(5 * time.Millisecond)
		<-tick.C
	}
}

// resume continues pglocks, which must exit 76: its lock was lost.
func resume(t *testing.T, h *holder) {
	t.Helper()
	if err := unix.Kill(h.cmd.Process.Pid, unix.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if code := h.wait(t); code != 76 {
		t.Fatalf("pglocks continued after its lock ran out: status %d, want 76", code)
	}
}

// leaseExpired waits until the lease name has expired by the server's
// clock and returns its expiry (final: its holder is stopped).
func (e jobEnv) leaseExpired(t *testing.T, name string) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := e.db.Conn(t)
	for {
		var expiry time.Time
		var expired bool
		err := conn.QueryRow(ctx, `select expires_at, expires_at <= clock_timestamp() from pglocks_leases where name = $1`,
			name).Scan(&expiry, &expired)
		if err != nil {
			t.Fatalf("lease %s: %v", name, err)
		}
		if expired {
			return expiry
		}
		tick := time.NewTimer(20 * time.Millisecond)
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("lease %s did not expire in a minute", name)
		}
	}
}

// parseState returns the state letter of a /proc/PID/stat ("PID (COMM) S …").
func parseState(b []byte) (string, bool) {
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || len(s) < i+3 {
		return "", false
	}
	return s[i+2 : i+3], true
}
