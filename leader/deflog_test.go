package leader_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/logtest"
	"github.com/pglocks/pglocks/leader"
)

// unreachablePool returns a pool on a local port where nothing listens:
// every dial is refused. It opens no connection up front.
func unreachablePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	cfg, err := pgxpool.ParseConfig("postgres://postgres@" + addr + "/x?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	cfg.MinConns = 0
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestDefaultLoggerWarns: an Elector made without Config.Logger that
// cannot reach the database says so at Warn through slog.Default(), in
// either mode, and nothing below Warn reaches it (campaigning is Debug).
// Not parallel: it sets the process's default logger.
func TestDefaultLoggerWarns(t *testing.T) {
	for _, mode := range []leader.Mode{leader.ModeAuto, leader.ModeLeaseOnly} {
		rec := logtest.SetDefault(t)
		e, err := leader.New(leader.Config{Name: "unreachable", Pool: unreachablePool(t), Mode: mode, RetryInterval: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- e.Run(ctx, func(context.Context, leader.Term) error { return nil }) }()
		r, ok := rec.Wait(slog.LevelWarn, "leader:", 30*time.Second)
		cancel()
		<-done
		if err := e.Close(t.Context()); err != nil {
			t.Error(err)
		}
		if !ok {
			t.Errorf("mode %v: no Warn from the elector reached slog.Default() within 30s; records: %v", mode, rec.Records())
			continue
		}
		t.Logf("mode %v: %v", mode, r)
		if below := rec.Below(slog.LevelWarn, "leader:"); len(below) > 0 {
			t.Errorf("mode %v: records below Warn reached slog.Default(): %v", mode, below)
		}
	}
}

// TestRunSaysWhyItNeverCampaigned: when Run's ctx ends while no campaign
// of that Run ever reached the database, Run returns an error naming the
// last failure (here: the refused connection), in either mode, instead of
// nil; a Run that did campaign still returns nil (the other tests).
func TestRunSaysWhyItNeverCampaigned(t *testing.T) {
	t.Parallel()
	for _, mode := range []leader.Mode{leader.ModeAuto, leader.ModeLeaseOnly} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			e, err := leader.New(leader.Config{Name: "unreachable", Pool: unreachablePool(t), Mode: mode,
				RetryInterval: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = e.Close(context.Background()) })
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			err = e.Run(ctx, func(context.Context, leader.Term) error { return nil })
			t.Logf("Run: %v", err)
			if err == nil || !strings.Contains(err.Error(), "refused") {
				t.Fatalf("Run = %v, want the error that kept every campaign from the database", err)
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Run = %v: wraps ctx's error, which callers take for a normal stop", err)
			}
		})
	}
}
