package pgtest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pglocks/pglocks/pgtest"
)

// TestCluster shows a cluster's contract: writes reach the standby (at once
// when synchronous), the standby refuses writes, Promote leaves a writable
// primary that the multi-host DSN follows with everything acknowledged,
// and Rejoin makes a standby of the former primary.
func TestCluster(t *testing.T) {
	t.Parallel()
	for _, sync := range []bool{false, true} {
		name := "Async"
		var opts []pgtest.Option
		if sync {
			name = "Sync"
			opts = append(opts, pgtest.WithSynchronousStandby())
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testCluster(t, pgtest.NewCluster(t, opts...))
		})
	}
}

func testCluster(t *testing.T, c *pgtest.Cluster) {
	ctx := ctxT(t, 3*time.Minute)
	db := c.NewDB(t)
	conn := db.Conn(t)
	if _, err := conn.Exec(ctx, "create table t (x int)"); err != nil {
		t.Fatal(err)
	}
	if err := c.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	standby := connect(t, c.StandbyDSN(db.Name))
	_, err := standby.Exec(ctx, "insert into t values (0)")
	if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Fatalf("a write on the standby gave %v, want SQLSTATE 25006 (read-only transaction)", err)
	}
	for i := 1; i <= 100; i++ {
		if _, err := conn.Exec(ctx, "insert into t values ($1)", i); err != nil {
			t.Fatal(err)
		}
	}
	if c.Sync() {
		// Synchronous: acknowledged means on the standby; remote_apply is
		// not asked for, so wait for replay rather than read at once.
		waitRows(t, ctx, standby, 100)
	}
	took, err := c.Promote(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("promotion took %v (immediate stop to first write accepted)", took)
	if _, err := c.Promote(ctx); err == nil {
		t.Fatal("a second Promote without a standby succeeded")
	}
	// The multi-host DSN now reaches the promoted node. A synchronous
	// standby has every acknowledged row; an asynchronous one may not.
	after := connect(t, db.DSN)
	var n int
	if err := after.QueryRow(ctx, "select count(*) from t").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if c.Sync() && n != 100 {
		t.Fatalf("after promotion %d of 100 acknowledged rows survive a synchronous failover", n)
	}
	t.Logf("%d of 100 rows on the promoted node", n)
	if _, err := after.Exec(ctx, "insert into t values (101)"); err != nil {
		t.Fatalf("write on the promoted primary through the multi-host DSN: %v", err)
	}
	if err := c.Rejoin(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(t, ctx, connect(t, c.StandbyDSN(db.Name)), n+1)
}

// waitRows waits until table t on conn has want rows.
func waitRows(t *testing.T, ctx context.Context, conn *pgx.Conn, want int) {
	t.Helper()
	var n int
	waitFor(t, ctx, func() bool {
		return conn.QueryRow(ctx, "select count(*) from t").Scan(&n) == nil && n == want
	}, func() string { return fmt.Sprintf("the standby has %d rows, want %d", n, want) })
}

// TestClusterTeardown proves that a cluster leaves nothing behind — no
// process and no temp dir of either node — after Close, after a failover
// and Close, and when its test binary panics or is SIGKILLed.
func TestClusterTeardown(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short")
	}
	for _, promote := range []bool{false, true} {
		name := map[bool]string{false: "Close", true: "PromoteClose"}[promote]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := ctxT(t, 3*time.Minute)
			c, err := pgtest.StartCluster(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var dirs []string
			var pids []int
			for _, dsn := range []string{c.PrimaryDSN("postgres"), c.StandbyDSN("postgres")} {
				var dir string
				if err := connect(t, dsn).QueryRow(ctx, "show data_directory").Scan(&dir); err != nil {
					t.Fatal(err)
				}
				dirs = append(dirs, filepath.Dir(dir))
				pids = append(pids, serverPIDs(t, dir)...)
			}
			if promote {
				if _, err := c.Promote(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			for _, d := range dirs {
				if _, err := os.Stat(d); !os.IsNotExist(err) {
					t.Errorf("temp dir %s remains after Close", d)
				}
			}
			if anyAlive(pids) {
				t.Errorf("server processes among %v remain after Close", pids)
			}
		})
	}
	for _, fault := range []string{"panic", "sigkill"} {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			child := teardownChild(t, fault, "PGTEST_DOCKER=0", "PGTEST_CHILD_CLUSTER=1")
			if child.standby == "" {
				t.Fatal("the child reported no standby")
			}
			dirs := []string{filepath.Dir(child.where), filepath.Dir(child.standby)}
			waitFor(t, ctxT(t, 2*time.Minute), func() bool {
				for _, d := range dirs {
					if _, err := os.Stat(d); !os.IsNotExist(err) {
						return false
					}
				}
				return !anyAlive(child.pids)
			}, func() string {
				return fmt.Sprintf("after %s: temp dirs %v or server processes %v remain", fault, dirs, child.pids)
			})
		})
	}
}
