package dial_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/dial"
	"github.com/pglocks/pglocks/pgtest"
)

// A session's settings run under the role's statement_timeout until their
// first statement has turned it off; a tiny timeout (here 1 ms, against a
// first statement that takes 20 ms, as a stalled server would) cancels
// them. Nothing took effect, so the dial runs them again — a bounded
// number of times: settings that are always cancelled fail the dial.
func TestSettingsCancelledByStatementTimeout(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	cfg, err := pgxpool.ParseConfig(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["options"] = "-c statement_timeout=1ms"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const stall = "select pg_sleep(0.02)"
	for _, tc := range []struct {
		name    string
		stalls  int64 // runs whose first statement stalls
		wantErr bool
	}{{"once", 1, false}, {"always", 1 << 30, true}} {
		var runs atomic.Int64
		settings := func(*pgconn.PgConn) string {
			if runs.Add(1) <= tc.stalls {
				return stall + "; set statement_timeout = 0"
			}
			return "set statement_timeout = 0"
		}
		c, err := dial.Dedicated(ctx, cfg, dial.Options{Settings: settings})
		var pe *pgconn.PgError
		switch {
		case tc.wantErr && (!errors.As(err, &pe) || pe.Code != "57014"):
			t.Errorf("%s: %v after %d runs, want the statement_timeout's cancel", tc.name, err, runs.Load())
		case !tc.wantErr && err != nil:
			t.Errorf("%s: %v after %d runs", tc.name, err, runs.Load())
		case !tc.wantErr:
			var timeout string
			if err := c.QueryRow(ctx, "show statement_timeout").Scan(&timeout); err != nil || timeout != "0" {
				t.Errorf("%s: statement_timeout %q (%v), want 0", tc.name, timeout, err)
			}
			_ = c.Close(ctx)
		}
		if tc.wantErr && runs.Load() != 3 {
			t.Errorf("%s: settings ran %d times, want 3", tc.name, runs.Load())
		}
	}
}

// Check runs once the backend's pid is known and before any setting:
// refused, the dial fails with its error as is and sends no setting;
// accepted, Settings and then IdleSessionTimeout follow.
func TestCheckBeforeSettings(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	cfg, err := pgxpool.ParseConfig(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	refused := errors.New("refused")
	var settings atomic.Int64
	o := dial.Options{
		Settings:           func(*pgconn.PgConn) string { settings.Add(1); return "set lock_timeout = '7s'" },
		IdleSessionTimeout: 3 * time.Second,
	}
	var seen uint32
	o.Check = func(_ context.Context, c dial.Conn) error { seen = c.BackendPID; return refused }
	if _, err := dial.Dedicated(ctx, cfg, o); !errors.Is(err, refused) || settings.Load() != 0 || seen == 0 {
		t.Fatalf("refused by Check: %v, settings run %d times, Check saw pid %d; want the Check's error, none, a pid", err, settings.Load(), seen)
	}
	o.Check = func(context.Context, dial.Conn) error { return nil }
	c, err := dial.Dedicated(ctx, cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var lock, idle string
	if err := c.QueryRow(ctx, "select current_setting('lock_timeout'), current_setting('idle_session_timeout')").Scan(&lock, &idle); err != nil {
		t.Fatal(err)
	}
	if lock != "7s" || idle != "3s" || c.BackendPID == 0 {
		t.Errorf("accepted: lock_timeout %q, idle_session_timeout %q, pid %d; want 7s, 3s and a pid", lock, idle, c.BackendPID)
	}
}
