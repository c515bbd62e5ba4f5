package advisory_test

import (
	"context"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/internal/routetest"
	"github.com/pglocks/pglocks/pgtest"
)

// silentFirstHost returns dsn (db's, or a pooler's in front of it) with a
// silent host listed before its own — a blackholed proxy to db's server:
// it accepts connections and never answers, as a node cut off by a
// partition does (packets dropped, no reset), so a connect to it waits out
// connect_timeout (2 s) — so that the host after it is the only one that
// answers.
func silentFirstHost(t *testing.T, db *pgtest.DB, dsn string) string {
	t.Helper()
	p, _ := db.Proxy(t)
	p.Blackhole()
	return routetest.FirstHost(t, dsn, p.Addr(), map[string]string{"connect_timeout": "2", "target_session_attrs": "read-write"})
}

// TestSilentFirstHost: a multi-host DSN whose first host is silent (a
// partitioned old primary listed before the new one) costs each session
// dial that host's connect_timeout, and the Locker still locks: the engine
// probe's second connection goes to the server the first one reached,
// instead of walking the host list again and running out of the dial's
// time on the silent host (which refused every session, so a Lock waited
// forever).
func TestSilentFirstHost(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	lockWithin30s(t, silentFirstHost(t, db, db.DSN))
}

// lockWithin30s makes a Locker on dsn and takes a lock within 30 s.
func lockWithin30s(t *testing.T, dsn string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := advisory.New(lazyPool(t, dsn), advisory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
	defer lcancel()
	start := time.Now()
	lk, err := l.Lock(lctx, pglocks.KeyOf("silent-first-host"))
	if err != nil {
		t.Fatalf("Lock behind a silent first host: %v after %v", err, time.Since(start))
	}
	t.Logf("locked after %v (connect_timeout 2 s on the silent host)", time.Since(start))
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestProbeBehindConnector: a pool whose DialFunc ignores the address it
// is given (a cloud connector's tunnel) and whose DSN names several
// placeholder hosts, or whose LookupFunc answers host:port (service
// discovery): the probe's second connection is dialled as the first was,
// and the Locker locks.
func TestProbeBehindConnector(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	u, err := url.Parse(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	server := u.Host
	for name, configure := range map[string]func(*pgxpool.Config){
		"DialFunc": func(c *pgxpool.Config) {
			c.ConnConfig.DialFunc = func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", server)
			}
		},
		"LookupFunc": func(c *pgxpool.Config) {
			c.ConnConfig.LookupFunc = func(context.Context, string) ([]string, error) { return []string{server}, nil }
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			v := *u
			v.Host = "10.255.255.1:5432,10.255.255.2:5432" // placeholders, never dialled as such
			l, err := advisory.New(lazyPool(t, v.String(), configure), advisory.Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close(ctx)
			lk, err := l.Lock(ctx, pglocks.KeyOf("behind-connector-"+name))
			if err != nil {
				t.Fatalf("Lock: %v", err)
			}
			if err := lk.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSilentFirstHostBehindPooler: the same silent first host before a
// session-mode PgBouncer: the pooler probe's second connection, like the
// engine probe's, goes to the pooler the first one reached, and the
// Locker locks.
func TestSilentFirstHostBehindPooler(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	b := pgtest.NewBouncer(t, db.Server, pgtest.PoolSession)
	viaBouncer, err := b.DSN(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	lockWithin30s(t, silentFirstHost(t, db, viaBouncer))
}
