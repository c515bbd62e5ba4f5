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

func TestExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	sum, err := run(ctx, exampledb.Target{DSN: pgtest.New(t).DSN}, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	want := summary{Processed: 1, Duplicates: deliveries - 2, Refused: 1, Credits: 1}
	if sum != want {
		t.Errorf("got %+v, want %+v", sum, want)
	}
}

// TestRerun runs the example twice on one database and schema:
// each run has its own payment and processes it once.
func TestRerun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	db := exampledb.Target{DSN: pgtest.New(t).DSN}
	for range 2 {
		var out bytes.Buffer
		sum, err := run(ctx, db, &out)
		if err != nil {
			t.Fatal(err)
		}
		if sum.Processed != 1 || sum.Credits != 1 {
			t.Errorf("got %+v, want one processed delivery and one credit", sum)
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

// TestIgnoresDatabaseURL: with DATABASE_URL set and no -dsn, the example
// runs on a throwaway server and leaves DATABASE_URL's database alone.
func TestIgnoresDatabaseURL(t *testing.T) { // not parallel: sets the environment
	exampletest.IgnoresDatabaseURL(t, run)
}
