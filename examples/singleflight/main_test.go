package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/pglocks/pglocks/examples/internal/exampledb"
	"github.com/pglocks/pglocks/examples/internal/exampletest"
	"github.com/pglocks/pglocks/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestComputedOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	res, err := run(ctx, exampledb.Target{DSN: pgtest.New(t).DSN}, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	const n = processes * requests
	if res.Requests != n || res.Computed != 1 || res.Waited+res.Hits != n-1 {
		t.Errorf("got %+v, want %d requests: 1 computed, %d reused", res, n, n-1)
	}
	if res.Computations != 1 {
		t.Errorf("compute ran %d times, want once", res.Computations)
	}
	if len(res.Values) != 1 {
		t.Errorf("requests saw values %v, want one value", res.Values)
	}
}

// TestLeavesNothing: run with -dsn on a user's database, the example works
// in a schema of its own and drops it; the user's tables, rows and leases
// are as they were.
func TestLeavesNothing(t *testing.T) {
	t.Parallel()
	exampletest.LeavesNothing(t, run)
}
