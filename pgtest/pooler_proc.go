package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/jackc/pgx/v5"
)

// findBinary finds a pooler's program: the path in the environment
// variable env, else name on PATH, else fallback; missing when none is.
func findBinary(env, name, fallback string, missing error) (string, error) {
	if p := os.Getenv(env); p != "" {
		if !isExecutable(p) {
			return "", fmt.Errorf("%s=%s is not an executable: %w", env, p, missing)
		}
		return p, nil
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if isExecutable(fallback) {
		return fallback, nil
	}
	return "", missing
}

// waitPooler waits until a query through dsn succeeds, with backoff. If the
// pooler's process exits first (done closes) or ctx ends, it stops it and
// fails with the tail of its log.
func waitPooler(ctx context.Context, what, dsn, logPath string, done <-chan struct{}, stop func()) error {
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgx.Connect(cctx, dsn)
		if err == nil {
			_, err = conn.Exec(cctx, "select 1")
			_ = conn.Close(cctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			stop()
			return fmt.Errorf("%s exited at start: %s", what, tail(logPath))
		case <-ctx.Done():
			stop()
			return fmt.Errorf("%s not ready: %w (last error: %v): %s", what, context.Cause(ctx), err, tail(logPath))
		case <-time.After(delay):
		}
	}
}
