package pgtest_test

import (
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

// TestPoolerPortTaken: a pooler whose port another listener takes between
// pgtest's pick of a free port and the pooler's bind — here a bouncer in
// front of the same server, which answers the readiness query as well —
// is not taken for ready: pgtest starts it again on another port, and the
// pooler a test gets is its own, still serving once the other listener is
// gone.
func TestPoolerPortTaken(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t) // its own: the port handed over is that of its next pooler
	db := srv.NewDB(t)
	starts := map[string]func(t *testing.T) (addr, dsn string){
		"pgbouncer": func(t *testing.T) (string, string) {
			b, dsn := db.Bouncer(t, pgtest.PoolTransaction)
			return b.Addr(), dsn
		},
		"pgpool": func(t *testing.T) (string, string) {
			p, dsn := db.Pgpool(t, false)
			return p.Addr(), dsn
		},
	}
	for name, start := range starts {
		t.Run(name, func(t *testing.T) {
			other, _ := db.Bouncer(t, pgtest.PoolSession)
			_, port, _ := net.SplitHostPort(other.Addr())
			n, err := strconv.Atoi(port)
			if err != nil {
				t.Fatal(err)
			}
			pgtest.NextPortForTest(srv, n)
			addr, dsn := start(t)
			if addr == other.Addr() {
				t.Errorf("%s reports the address another listener holds, %s, as its own", name, addr)
			}
			if err := other.Close(); err != nil {
				t.Fatal(err)
			}
			if _, got := backendOf(t, connect(t, dsn)); got != db.Name {
				t.Fatalf("through %s: database %q, want %q", name, got, db.Name)
			}
		})
	}
}

// TestBouncerTargets: a bouncer starts, and serves, in front of the
// servers users point pgtest at beyond a throwaway one: a PGTEST_DSN
// server reached as a role with a password (quotes and a space in both)
// and libpq's default sslmode (prefer: TLS, else plaintext), and a primary with a standby, whose DSN lists both hosts with
// target_session_attrs=read-write.
func TestBouncerTargets(t *testing.T) {
	t.Parallel()
	t.Run("Password", func(t *testing.T) {
		t.Parallel()
		own := pgtest.NewServer(t)
		ctx := ctxT(t, time.Minute)
		if err := own.RequirePasswords(ctx); err != nil {
			t.Fatal(err)
		}
		const user, password = "pg'test user", `pa'ss "word`
		role := pgx.Identifier{user}.Sanitize()
		if _, err := connect(t, own.DSN()).Exec(ctx, "create role "+role+" login superuser password '"+strings.ReplaceAll(password, "'", "''")+"'"); err != nil {
			t.Fatal(err)
		}
		cfg, err := pgx.ParseConfig(own.DSN())
		if err != nil {
			t.Fatal(err)
		}
		dsn := (&url.URL{Scheme: "postgres", User: url.UserPassword(user, password),
			Host: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), Path: "/postgres"}).String() // no sslmode: prefer, a TLS try, then plaintext
		srv, err := pgtest.Start(ctx, pgtest.WithDSN(dsn))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Close() })
		serves(t, srv.NewDB(t))
	})
	t.Run("Cluster", func(t *testing.T) {
		t.Parallel()
		serves(t, pgtest.NewCluster(t).NewDB(t))
	})
}

// serves starts a transaction-mode bouncer in front of db and runs a
// statement through it.
func serves(t *testing.T, db *pgtest.DB) {
	t.Helper()
	_, dsn := db.Bouncer(t, pgtest.PoolTransaction)
	if _, got := backendOf(t, connect(t, dsn)); got != db.Name {
		t.Fatalf("through the bouncer: database %q, want %q", got, db.Name)
	}
}
