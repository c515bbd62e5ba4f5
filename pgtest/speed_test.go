package pgtest_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

// speedSchema is the "few migrated tables" of a typical user's suite.
const speedSchema = `
create table users (id bigserial primary key, email text not null unique, created_at timestamptz not null default now());
create table orders (id bigserial primary key, user_id bigint not null references users, total numeric(12,2) not null);
create index on orders (user_id);
create table audit (id bigserial primary key, at timestamptz not null default now(), what jsonb);
`

// TestSpeed measures what a user's suite pays: the time from Start to the
// first migrated database, and the per-test database (create, connect,
// first query) p50/p95 over PGTEST_SPEED tests, parallel as t.Parallel
// runs them. Opt-in: PGTEST_SPEED=n (e.g. 100).
func TestSpeed(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("PGTEST_SPEED"))
	if n <= 0 {
		t.Skip("PGTEST_SPEED=n measures n per-test databases")
	}
	begin := time.Now()
	srv := pgtest.NewServer(t, pgtest.WithTemplate(func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, speedSchema)
		return err
	}))
	started := time.Since(begin)
	first := timeDB(t, srv)
	t.Logf("%s: server %v, first database %v after start", srv, started.Round(time.Millisecond), (started + first).Round(time.Millisecond))
	var mu sync.Mutex
	var took []time.Duration
	t.Run("Suite", func(t *testing.T) {
		for i := range n {
			t.Run(strconv.Itoa(i), func(t *testing.T) {
				t.Parallel()
				d := timeDB(t, srv)
				mu.Lock()
				took = append(took, d)
				mu.Unlock()
			})
		}
	})
	report(t, "per-test database", took)
	took = nil
	t.Run("Tx", func(t *testing.T) {
		for i := range n {
			t.Run(strconv.Itoa(i), func(t *testing.T) {
				t.Parallel()
				start := time.Now()
				tx := srv.NewTx(t)
				var c int
				if err := tx.QueryRow(t.Context(), "select count(*) from users").Scan(&c); err != nil {
					t.Fatal(err)
				}
				mu.Lock()
				took = append(took, time.Since(start))
				mu.Unlock()
			})
		}
	})
	report(t, "per-test NewTx", took)
}

func report(t *testing.T, what string, took []time.Duration) {
	slices.Sort(took)
	t.Logf("%s over %d: p50 %v, p95 %v, max %v", what, len(took),
		took[len(took)/2].Round(100*time.Microsecond), took[len(took)*95/100].Round(100*time.Microsecond), took[len(took)-1].Round(100*time.Microsecond))
}

// timeDB times one test's database: made, connected, a table queried.
func timeDB(t *testing.T, srv *pgtest.Server) time.Duration {
	start := time.Now()
	db := srv.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var c int
	if err := conn.QueryRow(ctx, "select count(*) from users").Scan(&c); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}
