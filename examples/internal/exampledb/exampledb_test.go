package exampledb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglocks/pglocks/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// schemas returns the example schemas in dsn's database.
func schemas(t *testing.T, ctx context.Context, db *pgtest.DB) []string {
	t.Helper()
	rows, err := db.NewPool(t).Query(ctx, `select nspname from pg_namespace where nspname like 'pglocks\_example\_%' order by 1`)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		names = append(names, s)
	}
	return names
}

// makeTable is an example's run that creates a table (unqualified: the
// search_path's) and a row, then fails with fail, or waits for ctx to end
// when fail is nil.
func makeTable(ready chan<- struct{}, fail error) func(context.Context, Target, io.Writer) (string, error) {
	return func(ctx context.Context, db Target, out io.Writer) (string, error) {
		conn, err := pgx.Connect(ctx, db.DSN)
		if err != nil {
			return "", err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		if _, err := conn.Exec(ctx, `create table made (x int); insert into made values (1)`); err != nil {
			return "", err
		}
		var schema string
		if err := conn.QueryRow(ctx, `select table_schema from information_schema.tables where table_name = 'made'`).Scan(&schema); err != nil {
			return "", err
		}
		if schema != db.Schema {
			return schema, fmt.Errorf("table made in schema %q, want %q", schema, db.Schema)
		}
		close(ready)
		if fail != nil {
			return schema, fail
		}
		<-ctx.Done()
		return schema, context.Cause(ctx)
	}
}

// TestDroppedOnFailure: a run that fails, or is interrupted (Ctrl-C ends
// Main's context), still leaves no schema behind, for a URL or a
// keyword/value DSN.
func TestDroppedOnFailure(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	cfg, err := pgconn.ParseConfig(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	keywords := fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", cfg.Host, cfg.Port, cfg.User, cfg.Database)
	boom := errors.New("boom")
	for _, tc := range []struct {
		name, dsn string
		fail      error
	}{
		{"url, failed", db.DSN, boom},
		{"keywords, failed", keywords, boom},
		{"url, interrupted", db.DSN, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			runCtx, interrupt := context.WithCancel(ctx)
			ready := make(chan struct{})
			go func() {
				select {
				case <-ready:
					interrupt()
				case <-ctx.Done():
				}
			}()
			var out bytes.Buffer
			err := Run(runCtx, []string{"-dsn", tc.dsn}, &out, makeTable(ready, tc.fail))
			t.Logf("output: %s", out.String())
			if want := tc.fail; want == nil && !errors.Is(err, context.Canceled) || want != nil && !errors.Is(err, want) {
				t.Fatalf("Run: %v, want %v", err, cmp(tc.fail, context.Canceled))
			}
			if !strings.Contains(out.String(), "in schema "+SchemaPrefix) {
				t.Errorf("output does not name the schema")
			}
			if left := schemas(t, ctx, db); len(left) > 0 {
				t.Errorf("schemas left behind: %v", left)
			}
		})
	}
}

func cmp(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// TestFlags: only -dsn is accepted.
func TestFlags(t *testing.T) {
	t.Parallel()
	never := func(context.Context, Target, io.Writer) (int, error) { return 0, errors.New("ran") }
	for _, args := range [][]string{{"-database-url", "x"}, {"extra"}} {
		if err := Run(t.Context(), args, io.Discard, never); err == nil || err.Error() == "ran" {
			t.Errorf("Run(%q) = %v, want a usage error before running", args, err)
		}
	}
}
