package lease_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/lease"
)

func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	ttls := []struct {
		ttl  time.Duration
		want string
	}{
		{0, "not positive"},
		{-time.Second, "not positive"},
		{500 * time.Microsecond, "below the minimum"},
		{25 * time.Hour, "above Config.MaxTTL"},
	}
	for _, tc := range ttls {
		_, err := b.store.TryAcquire(ctx, "x", tc.ttl)
		if !errors.Is(err, lease.ErrInvalidTTL) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ttl %v: %v, want ErrInvalidTTL %q", tc.ttl, err, tc.want)
		}
	}
	names := []struct{ name, want string }{
		{"", "empty name"},
		{"a\x00b", "NUL"},
		{"\xff\xfe", "UTF-8"},
		{strings.Repeat("n", lease.MaxNameLen+1), "MaxNameLen"},
	}
	for _, tc := range names {
		for op, f := range map[string]func() error{
			"TryAcquire": func() error { _, err := b.store.TryAcquire(ctx, tc.name, time.Second); return err },
			"Acquire":    func() error { _, err := b.store.Acquire(ctx, tc.name, time.Second); return err },
			"Get":        func() error { _, err := b.store.Get(ctx, tc.name); return err },
			"Break":      func() error { _, err := b.store.Break(ctx, tc.name); return err },
		} {
			if err := f(); !errors.Is(err, pglocks.ErrInvalidKey) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s(%.20q): %v, want ErrInvalidKey %q", op, tc.name, err, tc.want)
			}
		}
	}
	mustTry(t, b.store, strings.Repeat("n", lease.MaxNameLen), time.Second) // the longest name works
	if _, err := b.store.TryAcquire(ctx, "x", time.Second, lease.WithMetadata([]byte("{"))); err == nil {
		t.Error("invalid JSON metadata accepted")
	}
	if _, err := lease.New(nil, lease.Config{}); !errors.Is(err, lease.ErrInvalidConfig) || !strings.Contains(err.Error(), "nil pool") {
		t.Errorf("New(nil): %v", err)
	}
	// An explicit safety margin longer than the TTL.
	s := newStore(t, b.pool, lease.Config{SafetyMargin: time.Second})
	if _, err := s.TryAcquire(ctx, "x", 500*time.Millisecond); !errors.Is(err, lease.ErrInvalidTTL) || !strings.Contains(err.Error(), "SafetyMargin") {
		t.Errorf("ttl under the margin: %v", err)
	}
}

func TestClosedStore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	s, err := lease.New(b.pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l := mustTry(t, s, "kept", time.Minute, lease.WithKeepAlive())
	busy := mustTry(t, b.store, "busy", time.Hour)
	waiting := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctx, "busy", time.Minute)
		waiting <- err
	}()
	waitWaiting(t, bundle{store: s}, "busy")
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := <-waiting; !errors.Is(err, lease.ErrClosed) {
		t.Fatalf("waiting Acquire: %v, want ErrClosed", err)
	}
	if c := context.Cause(l.Context()); !errors.Is(c, lease.ErrClosed) {
		t.Fatalf("lease context cause %v, want ErrClosed", c)
	}
	for op, f := range map[string]func() error{
		"TryAcquire": func() error { _, err := s.TryAcquire(ctx, "x", time.Second); return err },
		"Acquire":    func() error { _, err := s.Acquire(ctx, "x", time.Second); return err },
		"Resume":     func() error { _, err := s.Resume(ctx, l.Handle()); return err },
		"Get":        func() error { _, err := s.Get(ctx, "x"); return err },
		"List":       func() error { _, err := s.List(ctx); return err },
		"Migrate":    func() error { return s.Migrate(ctx) },
		"Renew":      func() error { return l.Renew(ctx) },
		"Release":    func() error { return l.Release(ctx) },
	} {
		if err := f(); !errors.Is(err, lease.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", op, err)
		}
	}
	// Close did not release: the lease stays held until its TTL ends.
	if held, err := b.store.IsHeld(ctx, "kept"); err != nil || !held {
		t.Fatalf("IsHeld after Close = %v, %v", held, err)
	}
	_ = busy
}

func TestConfig(t *testing.T) {
	t.Parallel()
	bad := []struct {
		cfg  lease.Config
		want string
	}{
		{lease.Config{Schema: "bad-name"}, "Config.Schema"},
		{lease.Config{Table: `x"; drop table y; --`}, "Config.Table"},
		{lease.Config{Table: "1abc"}, "Config.Table"},
		{lease.Config{Channel: strings.Repeat("c", 64)}, "Config.Channel"},
		{lease.Config{MaxTTL: time.Microsecond}, "Config.MaxTTL"},
		{lease.Config{MaxTTL: 20 * 365 * 24 * time.Hour}, "Config.MaxTTL"},
		{lease.Config{SafetyMargin: -time.Second}, "Config.SafetyMargin"},
		{lease.Config{MaxTTL: time.Minute, SafetyMargin: time.Minute}, "less than Config.MaxTTL"},
		{lease.Config{RenewFraction: 0.7}, "Config.RenewFraction"},
		{lease.Config{RenewFraction: -1}, "Config.RenewFraction"},
		{lease.Config{PID: -2}, "Config.PID"},
	}
	for _, tc := range bad {
		_, err := lease.SchemaSQL(tc.cfg)
		if !errors.Is(err, lease.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
	ddl, err := lease.SchemaSQL(lease.Config{Schema: "locks", Table: "Leases"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ddl, `create schema if not exists "locks"`) || !strings.Contains(ddl, `"locks"."Leases"`) {
		t.Fatalf("DDL:\n%s", ddl)
	}
}

// TestMigrateCustomTable: Migrate is idempotent, safe to run concurrently,
// and the store works on a table of its own in a schema of its own.
func TestMigrateCustomTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	cfg := lease.Config{Schema: "locks", Table: "Job_Leases"}
	s := newStore(t, b.pool, cfg)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := s.Migrate(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	l := mustTry(t, s, "x", time.Minute)
	var token int64
	if err := b.pool.QueryRow(ctx, `select token from locks."Job_Leases" where name = 'x'`).Scan(&token); err != nil || token != l.Token() {
		t.Fatalf("token in the custom table: %d, %v", token, err)
	}
	if _, err := b.store.Get(ctx, "x"); !errors.Is(err, lease.ErrNotFound) {
		t.Fatalf("the default table has the lease: %v", err)
	}
}
