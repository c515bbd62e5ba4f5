package pgtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglocks/pglocks/pgtest"
)

func TestProxy(t *testing.T) {
	t.Parallel()
	testProxy(t, pgtest.SharedServer(t))
}

// testProxy proves the proxy's byte-level faults in front of srv.
func testProxy(t *testing.T, srv *pgtest.Server) {
	t.Run("Pass", func(t *testing.T) {
		t.Parallel()
		db := srv.NewDB(t)
		_, dsn := db.Proxy(t)
		if got := currentDatabase(t, connect(t, dsn)); got != db.Name {
			t.Fatalf("through the proxy: connected to %q, want %q", got, db.Name)
		}
	})
	t.Run("Blackhole", func(t *testing.T) {
		t.Parallel()
		db := srv.NewDB(t)
		p, dsn := db.Proxy(t)
		proxied, direct := connect(t, dsn), db.Conn(t)
		p.Blackhole()
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		_, err := proxied.Exec(ctx, "select 1")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("query through a blackhole: %v, want the ctx deadline", err)
		}
		if _, err := direct.Exec(ctxT(t, 30*time.Second), "select 1"); err != nil {
			t.Fatalf("direct connection during the blackhole: %v", err)
		}
		// New connections hang too.
		ctx2, cancel2 := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel2()
		if c, err := pgtestConnect(ctx2, dsn); err == nil {
			c.Close(context.Background())
			t.Fatal("a new connection through a blackhole succeeded")
		}
		p.Pass()
		if got := currentDatabase(t, connect(t, dsn)); got != db.Name {
			t.Fatalf("after Pass: connected to %q", got)
		}
	})
	t.Run("Reset", func(t *testing.T) {
		t.Parallel()
		db := srv.NewDB(t)
		p, dsn := db.Proxy(t)
		conn := connect(t, dsn)
		if n := p.Reset(); n != 1 {
			t.Fatalf("reset %d connections, want 1", n)
		}
		ctx := ctxT(t, 30*time.Second)
		if _, err := conn.Exec(ctx, "select 1"); err == nil {
			t.Fatal("a reset connection's next query succeeded")
		}
		if got := currentDatabase(t, connect(t, dsn)); got != db.Name {
			t.Fatalf("new connection after Reset: %q", got)
		}
	})
	t.Run("Latency", func(t *testing.T) {
		t.Parallel()
		db := srv.NewDB(t)
		p, dsn := db.Proxy(t)
		conn := connect(t, dsn)
		const latency = 50 * time.Millisecond
		p.SetLatency(latency)
		start := time.Now()
		if _, err := conn.Exec(ctxT(t, 30*time.Second), "select 1"); err != nil {
			t.Fatal(err)
		}
		// One round trip crosses the proxy twice.
		if took := time.Since(start); took < 2*latency {
			t.Fatalf("a round trip took %v with %v latency each way", took, latency)
		}
	})
	t.Run("CloseIsIdempotent", func(t *testing.T) {
		t.Parallel()
		addr, err := srv.Addr()
		if err != nil {
			t.Fatal(err)
		}
		p, err := pgtest.StartProxy(addr)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if err := p.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
}
