package main

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglocks/pglocks/examples/internal/exampledb"
	"github.com/pglocks/pglocks/examples/internal/exampletest"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestHandoff(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	res, err := run(ctx, exampledb.Target{DSN: pgtest.New(t).DSN}, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if res.APIToken == 0 || res.WorkerToken != res.APIToken {
		t.Errorf("worker's token %d, want the API's %d: the same acquisition", res.WorkerToken, res.APIToken)
	}
	if !errors.Is(res.Refused, lease.ErrHeld) {
		t.Errorf("second request: %v, want lease.ErrHeld while the job is queued", res.Refused)
	}
	if res.After.Held || res.After.Token != res.APIToken {
		t.Errorf("after the job: %+v, want free with token %d", res.After, res.APIToken)
	}
}

// TestExpiredJobDropped queues a job whose lease has since been broken (as if
// it expired in the queue): the worker drops it and does the next one.
func TestExpiredJobDropped(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	db := exampledb.Target{DSN: pgtest.New(t).DSN}
	if _, err := run(ctx, db, &bytes.Buffer{}); err != nil { // creates the tables
		t.Fatal(err)
	}
	p, err := start(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer p.exit(context.WithoutCancel(ctx))
	stale, _, err := p.requestExport(ctx, "stale")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.store.Break(ctx, stale.Name()); err != nil {
		t.Fatal(err)
	}
	fresh, _, err := p.requestExport(ctx, "fresh")
	if err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	l, err := p.work(ctx, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if l.Name() != fresh.Name() || l.Token() != fresh.Token() {
		t.Errorf("worker did %s token %d, want %s token %d", l.Name(), l.Token(), fresh.Name(), fresh.Token())
	}
	var exports int
	if err := p.pool.QueryRow(ctx, `select count(*) from handoff_exports where report = 'stale'`).Scan(&exports); err != nil {
		t.Fatal(err)
	}
	if exports != 0 {
		t.Errorf("the stale job was exported %d times, want 0", exports)
	}
}

// TestLeavesNothing: run with -dsn on a user's database, the example works
// in a schema of its own and drops it; the user's tables, rows and leases
// are as they were.
func TestLeavesNothing(t *testing.T) {
	t.Parallel()
	exampletest.LeavesNothing(t, run)
}
