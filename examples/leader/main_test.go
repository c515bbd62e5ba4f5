package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pglocks/pglocks/examples/internal/exampledb"
	"github.com/pglocks/pglocks/examples/internal/exampletest"
	"github.com/pglocks/pglocks/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(replicaEnv) != "" { // re-executed by run as a replica
		main()
		return
	}
	pgtest.Main(m)
}

func TestFailover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := run(ctx, exampledb.Target{DSN: pgtest.New(t).DSN}, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}

	if !strings.HasPrefix(res.First.Identity, "replica-") || res.First.PID == 0 {
		t.Errorf("first leader = %+v, want one of the replica processes", res.First)
	}
	if ws, ok := res.Killed.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("first leader's process ended with %v, want killed by SIGKILL", res.Killed)
	}
	if res.Next.Identity == res.First.Identity || res.Next.PID == res.First.PID {
		t.Errorf("new leader %s (pid %d) is the killed one", res.Next.Identity, res.Next.PID)
	}
	if res.Next.Term <= res.First.Term {
		t.Errorf("new term %d, want above %d", res.Next.Term, res.First.Term)
	}
	// The package promises a new leader within about a second after a crash.
	if res.Took <= 0 || res.Took > 3*time.Second {
		t.Errorf("failover took %v, want within 3s", res.Took)
	}
	if res.End.Held {
		t.Errorf("after the replicas stopped, %s still leads", res.End.Identity)
	}
	for _, want := range []string{"kill -9 " + res.First.Identity, "failover took"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// TestLeavesNothing: run with -dsn on a user's database, the example works
// in a schema of its own and drops it; the user's tables, rows and leases
// are as they were.
func TestLeavesNothing(t *testing.T) {
	t.Parallel()
	exampletest.LeavesNothing(t, run)
}
