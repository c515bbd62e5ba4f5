package pgtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

func TestPartition(t *testing.T) {
	t.Parallel()
	t.Run("ServerDropsPartitionedSession", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		p, dsn := db.Proxy(t, pgtest.Partitionable())
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		// Make the server give up on a silent peer within seconds.
		cfg.RuntimeParams["tcp_keepalives_idle"] = "1"
		cfg.RuntimeParams["tcp_keepalives_interval"] = "1"
		cfg.RuntimeParams["tcp_keepalives_count"] = "2"
		cfg.RuntimeParams["tcp_user_timeout"] = "2000"
		ctx := ctxT(t, time.Minute)
		holder, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close(context.Background())
		if _, err := holder.Exec(ctx, "select pg_advisory_lock(42)"); err != nil {
			t.Fatal(err)
		}
		observer := db.Conn(t)
		if err := p.Partition(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		// The client hangs...
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if _, err := holder.Exec(short, "select 1"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("query across a partition: %v, want the ctx deadline", err)
		}
		// ...and the server, seeing nothing from its peer, drops the session
		// and frees its lock.
		waitFor(t, ctx, func() bool {
			var got bool
			err := observer.QueryRow(ctx, "select pg_try_advisory_lock(42)").Scan(&got)
			return err == nil && got
		}, func() string { return "the server never dropped the partitioned session" })
		t.Logf("server freed the partitioned session's lock after %v", time.Since(start).Round(time.Millisecond))
	})
	t.Run("HealedSessionCarriesOn", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		p, dsn := db.Proxy(t, pgtest.Partitionable())
		conn := connect(t, dsn)
		if err := p.Partition(); err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		if _, err := conn.Exec(short, "select 1"); err == nil {
			t.Fatal("a query crossed the partition")
		}
		p.Pass()
		// The cancelled query broke that pgx connection; a new one works.
		if got := currentDatabase(t, connect(t, dsn)); got != db.Name {
			t.Fatalf("after healing: %q", got)
		}
	})
	t.Run("NeedsPartitionable", func(t *testing.T) {
		t.Parallel()
		p, _ := pgtest.New(t).Proxy(t)
		if err := p.Partition(); !errors.Is(err, pgtest.ErrUnsupported) {
			t.Fatalf("Partition on a plain proxy: %v", err)
		}
	})
}
