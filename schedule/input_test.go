package schedule_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/schedule"
)

// TestBadInput: bad configuration, policies, job names and slot keys give
// an error wrapping ErrInvalid that names the field or rule, never a panic.
func TestBadInput(t *testing.T) {
	t.Parallel()
	r := newReplica(t, pgtest.New(t), "r", 0)
	configs := map[string]schedule.Config{
		"Config.Store is nil":     {Pool: r.pool},
		"Config.Pool is nil":      {Store: r.store},
		"Config.Schema":           {Store: r.store, Pool: r.pool, Schema: "a-b"},
		"Config.Table":            {Store: r.store, Pool: r.pool, Table: strings.Repeat("t", 64)},
		"Config.History is -1":    {Store: r.store, Pool: r.pool, History: -1},
		"Config.History is 10001": {Store: r.store, Pool: r.pool, History: schedule.MaxHistory + 1},
	}
	for want, cfg := range configs {
		if _, err := schedule.New(cfg); !errors.Is(err, schedule.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("New(%s): %v", want, err)
		}
	}
	policies := map[string]schedule.Policy{
		"Policy.Period is -1h0m0s": {Period: -time.Hour},
		"Policy.Period is 1µs":     {Period: time.Microsecond},
		"Policy.Tolerance (5s) must be below half of Policy.Period (10s)": {Period: 10 * time.Second, Tolerance: 5 * time.Second},
		"Policy.Tolerance is -1s":                   {Period: time.Hour, Tolerance: -time.Second},
		"Policy.Tolerance is 1s but Period is zero": {Tolerance: time.Second},
		"Policy.AtLeast is -1s":                     {AtLeast: -time.Second},
		"Policy.AtMost is -1s":                      {AtMost: -time.Second},
		"Policy.TTL is -1s":                         {TTL: -time.Second},
		"Policy.AtMost (1s) and Policy.TTL (1s)":    {AtMost: time.Second, TTL: time.Second},
		"above the store's Config.MaxTTL":           {AtMost: 25 * time.Hour},
	}
	for want, p := range policies {
		if _, err := r.runner.Job("j", p); !errors.Is(err, schedule.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("Job(%s): %v", want, err)
		}
	}
	names := map[string]string{
		"job name is empty":          "",
		"not valid UTF-8":            "\xff",
		"contains a NUL byte":        "a\x00b",
		"job name is 513 bytes long": strings.Repeat("x", schedule.MaxJobLen+1),
	}
	for want, name := range names {
		if _, err := r.runner.Job(name, schedule.Policy{Period: time.Hour}); !errors.Is(err, schedule.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("Job(%q): %v", name, err)
		}
	}
}

// TestBadCalls: bad arguments to a Job's, Run's and Runner's methods give
// errors naming them; so do a nil Runner and a nil Run.
func TestBadCalls(t *testing.T) {
	t.Parallel()
	r := newReplica(t, pgtest.New(t), "r", 0)
	ctx := ctxT(t)
	job := r.job(t, "j", schedule.Policy{})
	if _, err := job.Start(ctx); !errors.Is(err, schedule.ErrInvalid) || !strings.Contains(err.Error(), "neither Period nor AtLeast") {
		t.Errorf("Start without a period: %v", err)
	}
	if _, err := job.StartSlot(ctx, ""); !errors.Is(err, schedule.ErrInvalid) || !strings.Contains(err.Error(), "slot key is empty") {
		t.Errorf("StartSlot(\"\"): %v", err)
	}
	if _, err := job.DoSlot(ctx, "s", nil); !errors.Is(err, schedule.ErrInvalid) {
		t.Errorf("DoSlot(nil): %v", err)
	}
	//lint:ignore SA1012 a nil context is the bad input under test
	if _, err := job.StartSlot(nil, "s"); err == nil || !strings.Contains(err.Error(), "nil context") { //nolint:staticcheck
		t.Errorf("StartSlot(nil ctx): %v", err)
	}
	if _, err := r.runner.History(ctx, "", 0); !errors.Is(err, schedule.ErrInvalid) {
		t.Errorf("History(0): %v", err)
	}
	// The default tolerance is 5 s, or a quarter of a short period.
	for period, want := range map[time.Duration]time.Duration{time.Hour: 5 * time.Second, time.Second: 250 * time.Millisecond} {
		if got := r.job(t, "j", schedule.Policy{Period: period}).Policy().Tolerance; got != want {
			t.Errorf("default tolerance for %v: %v, want %v", period, got, want)
		}
	}
	if _, err := schedule.SchemaSQL(schedule.Config{Table: "bad name"}); !errors.Is(err, schedule.ErrInvalid) {
		t.Errorf("SchemaSQL: %v", err)
	}
	var nilRunner *schedule.Runner
	if _, err := nilRunner.Job("j", schedule.Policy{}); err == nil {
		t.Error("Job of a nil Runner: no error")
	}
	var nilRun *schedule.Run
	if _, err := nilRun.End(context.Background(), nil); err == nil {
		t.Error("End of a nil Run: no error")
	}
}

// TestBusy: a period slot whose job is held by another slot's run waits
// for it, and runs once it ends; if it does not end before the slot's
// window closes, the slot is not run and Start says why.
func TestBusy(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := pgtest.New(t)
	a, b := newReplica(t, db, "a", 0), newReplica(t, db, "b", 0)
	const period, tolerance = 2 * time.Second, 100 * time.Millisecond
	policy := schedule.Policy{Period: period, Tolerance: tolerance}
	awaitRoom(t, a.pool, period, tolerance, 1500*time.Millisecond)
	long, err := a.job(t, "busy", policy).StartSlot(ctx, "explicit")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := b.job(t, "busy", policy).Do(ctx, b.work)
		done <- err
	}()
	// b waits for a's run (its store announces its interest in the job's
	// lease: see the lease package doc, Waiting); once it ends, b runs.
	awaitWaiter(t, a, "busy")
	if _, err := long.End(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the waiting slot: %v", err)
	}
	// A run that outlasts the next slot's window: the slot is not run.
	start := awaitNext(t, a.pool, period, tolerance)
	long, err = a.job(t, "busy", policy).StartSlot(ctx, "explicit-2")
	if err != nil {
		t.Fatal(err)
	}
	defer long.End(ctx, nil)
	began := time.Now()
	_, err = b.job(t, "busy", policy).Start(ctx)
	if !errors.Is(err, schedule.ErrBusy) {
		t.Fatalf("start while another slot's run outlasts the window: %v", err)
	}
	t.Logf("%v after %v (the window closed %v after the slot's start)", err, time.Since(began).Round(time.Millisecond), period-tolerance)
	if n := doneCount(t, a.pool, "busy", schedule.SlotKey(start)); n != 0 {
		t.Fatalf("the busy slot ran %d times", n)
	}
}

// awaitWaiter waits until some store waits for job's lease: it then holds
// the interest key the lease package documents (Waiting).
func awaitWaiter(t *testing.T, r *replica, job string) {
	key := pglocks.KeyOf("pglocks.lease:" + lease.DefaultTable + ":" + schedule.LeasePrefix + job)
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); <-poll.C {
		held, err := advisory.IsHeld(context.Background(), r.pool, key)
		if err != nil {
			t.Error(err)
			return
		}
		if held {
			return
		}
	}
	t.Error("no store waited for the job's lease within a minute")
}

// TestLeaseFloor: a Policy whose run's lease would be shorter than
// lease.MinTTL — TTL or AtMost — is refused by Runner.Job with an error
// naming the field, not by every Start.
func TestLeaseFloor(t *testing.T) {
	t.Parallel()
	r := newReplica(t, pgtest.New(t), "r", 0)
	for want, p := range map[string]schedule.Policy{
		"Policy.TTL is 50ms":    {TTL: 50 * time.Millisecond},
		"Policy.AtMost is 99ms": {AtMost: 99 * time.Millisecond},
	} {
		if _, err := r.runner.Job("j", p); !errors.Is(err, schedule.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("Job(%s): %v, want ErrInvalid naming it", want, err)
		}
		if err := p.Validate(); !errors.Is(err, schedule.ErrInvalid) {
			t.Errorf("Validate(%s): %v", want, err)
		}
	}
	if _, err := r.runner.Job("j", schedule.Policy{AtMost: lease.MinTTL}); err != nil {
		t.Errorf("AtMost = lease.MinTTL: %v", err)
	}
}

// TestNoRunTable: without the run table, a Start and History fail with an
// error wrapping ErrNoTable that says how to create it.
func TestNoRunTable(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	r := newReplica(t, pgtest.New(t), "r", 0)
	if _, err := r.pool.Exec(ctx, "drop table pglocks_runs"); err != nil {
		t.Fatal(err)
	}
	_, startErr := r.job(t, "j", schedule.Policy{Period: time.Hour}).Start(ctx)
	_, histErr := r.runner.History(ctx, "", 1)
	for what, err := range map[string]error{"Start": startErr, "History": histErr} {
		if !errors.Is(err, schedule.ErrNoTable) || !strings.Contains(fmt.Sprint(err), "Runner.Migrate") || !strings.Contains(fmt.Sprint(err), "schedule.SchemaSQL") {
			t.Errorf("%s without the run table: %v, want ErrNoTable naming Runner.Migrate and schedule.SchemaSQL", what, err)
		}
	}
	t.Logf("Start without the run table: %v", startErr)
	if err := r.runner.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.job(t, "j", schedule.Policy{Period: time.Hour}).Do(ctx, r.work); err != nil {
		t.Fatalf("after Migrate: %v", err)
	}
}
