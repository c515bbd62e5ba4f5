package main

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/pglocks/pglocks/examples/internal/exampledb"
	"github.com/pglocks/pglocks/examples/internal/exampletest"
	"github.com/pglocks/pglocks/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestBusyResourceGets429(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	res, err := run(ctx, exampledb.Target{DSN: pgtest.New(t).DSN}, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}

	count := map[string]map[int]int{"/docs/7": {}, "/docs/8": {}}
	instances := map[string]bool{}
	for _, rep := range res.Concurrent {
		if rep.Err != nil {
			t.Fatalf("%v", rep)
		}
		count[rep.Path][rep.Status]++
		if rep.Status == http.StatusTooManyRequests {
			instances[rep.Instance] = true
			if rep.RetryAfter != "1" {
				t.Errorf("%v: Retry-After %q, want \"1\"", rep, rep.RetryAfter)
			}
		} else if rep.RetryAfter != "" {
			t.Errorf("%v: unexpected Retry-After", rep)
		}
	}
	if c := count["/docs/7"]; c[http.StatusOK] != 1 || c[http.StatusTooManyRequests] != 3 {
		t.Errorf("doc 7 got %v, want one 200 and three 429s", c)
	}
	if c := count["/docs/8"]; c[http.StatusOK] != 1 {
		t.Errorf("doc 8 got %v, want one 200: another resource is not serialized with doc 7", c)
	}
	if len(instances) != 2 {
		t.Errorf("429s came from instances %v, want both: the lock spans instances", instances)
	}
	if res.Again.Status != http.StatusOK {
		t.Errorf("PUT after the writes finished: %v, want 200: the lock was not released", res.Again)
	}
}

// TestLeavesNothing: run with -dsn on a user's database, the example works
// in a schema of its own and drops it; the user's tables, rows and leases
// are as they were.
func TestLeavesNothing(t *testing.T) {
	t.Parallel()
	exampletest.LeavesNothing(t, run)
}
