package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// pickPort picks the port a pooler in front of s is to listen on: a free
// one (see freePort), which another listener can take before the pooler
// binds it; or, once, the port a test set in s.nextPort, as if that had
// happened.
func pickPort(s *Server) (int, error) {
	if p := s.nextPort.Swap(0); p != 0 {
		return int(p), nil
	}
	return freePort()
}

// errNotOurs says a pooler's port answered, but not from the pooler pgtest
// started: another listener took the port between its pick and the
// pooler's bind. The pooler is stopped and started again on another port.
var errNotOurs = errors.New("another listener holds the port")

// waitPooler waits until a query through dsn succeeds, with backoff, then
// asks ours whether the pooler that answered is the one pgtest started (a
// port found free can be taken before the pooler binds it, and another
// pooler or proxy in front of the same server answers the query too). If
// the pooler's process exits first (done closes), ctx ends or another
// listener answered, it stops it and fails with the tail of its log.
func waitPooler(ctx context.Context, what, dsn, logPath string, done <-chan struct{}, stop func(), ours func(context.Context) error) error {
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgx.Connect(cctx, dsn)
		if err == nil {
			_, err = conn.Exec(cctx, "select 1")
			_ = conn.Close(cctx)
		}
		if err == nil {
			err = ours(cctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		if errors.Is(err, errNotOurs) {
			stop()
			logf("%s: %v (a port found free was taken before %s bound it; pgtest tries up to 5 ports)", what, err, what)
			return fmt.Errorf("%s: %w: %s", what, err, tail(logPath))
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

// askPooler runs one of a pooler's own commands, sql, on dsn with its
// database replaced by database when that is not empty, in the simple
// protocol (PgBouncer's admin console takes no other), and returns the
// rows as text. It connects to the first host only and asks nothing of
// the session at login (a DSN's target_session_attrs would run a SHOW the
// admin console refuses). A listener that refuses the command itself is
// not the pooler that was asked for: that is errNotOurs; an error before
// the command is an ordinary one.
func askPooler(ctx context.Context, dsn, database, sql string) ([][]string, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if database != "" {
		cfg.Database = database
	}
	// The same host and port only: a DSN's sslmode=prefer is a TLS try
	// with a plaintext fallback there.
	cfg.Fallbacks = slices.DeleteFunc(cfg.Fallbacks, func(f *pgconn.FallbackConfig) bool {
		return f.Host != cfg.Host || f.Port != cfg.Port
	})
	cfg.ValidateConnect = nil
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, _ := conn.Query(ctx, sql, pgx.QueryExecModeSimpleProtocol)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]string, error) {
		row := make([]string, len(r.RawValues()))
		for i, v := range r.RawValues() {
			row[i] = string(v)
		}
		return row, nil
	})
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) {
		return nil, fmt.Errorf("%w: %q answers %s", errNotOurs, sql, pgErr.Message)
	}
	return out, err
}
