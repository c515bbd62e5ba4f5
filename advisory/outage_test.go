package advisory_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// TryLock on a Locker that cannot open a session returns the cause after
// one failed dial, well under a second, not when its ctx ends.
func TestTryLockReportsDialCause(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	cases := []struct {
		name, dsn, want string
	}{
		{"RefusedPort", "postgres://postgres@" + closedAddr(t) + "/x?sslmode=disable", "refused"},
		{"MissingRole", withUser(t, db.DSN, "no_such_role_x", "pw"), "28000"},
		{"MissingDatabase", strings.Replace(db.DSN, "/"+db.Name, "/no_such_db_x", 1), "3D000"},
	}
	if !testing.Short() {
		srv := pgtest.NewServer(t)
		if err := srv.RequirePasswords(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		pdb := srv.NewDB(t)
		role := createRole(t, pdb)
		cases = append(cases, struct{ name, dsn, want string }{"WrongPassword", withUser(t, pdb.DSN, role, "wrong"), "28P01"})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := newLocker(t, lazyPool(t, c.dsn), advisory.Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, call := range []string{"TryLock", "Lock"} {
				start := time.Now()
				var err error
				if call == "TryLock" {
					_, err = l.TryLock(ctx, pglocks.KeyOf("dial-cause"))
				} else if c.name != "RefusedPort" { // refused is retried by Lock
					_, err = l.Lock(ctx, pglocks.KeyOf("dial-cause"))
				} else {
					continue
				}
				took := time.Since(start)
				t.Logf("%s returned after %v: %v", call, took.Round(time.Millisecond), err)
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("%s = %v, want an error naming %q", call, err, c.want)
				}
				if took > time.Second {
					t.Errorf("%s took %v, want < 1s", call, took)
				}
			}
		})
	}
}

// A Locker waiting through an outage backs off: little CPU, few dials,
// and the error names the last cause. Not parallel: it measures the
// process's CPU time.
func TestLockBacksOffThroughOutage(t *testing.T) {
	r := newRejecter(t)
	var dials atomic.Int64
	l := newLocker(t, lazyPool(t, "postgres://postgres@"+r.ln.Addr().String()+"/x?sslmode=disable", func(c *pgxpool.Config) {
		c.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
			dials.Add(1) // once per connection attempt
			return nil
		}
	}), advisory.Config{})
	const outage = 5 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), outage)
	defer cancel()
	cpu0, wall0 := cpuTime(t), time.Now()
	_, err := l.Lock(ctx, pglocks.KeyOf("outage"))
	cpu, wall := cpuTime(t)-cpu0, time.Since(wall0)
	n := dials.Load()
	t.Logf("Lock through a %v outage: returned after %v, %d connection attempts (%d TCP connections accepted: "+
		"pgconn opens two TCP connections per attempt to a server that closes at startup), CPU %v (%.1f%% of a core): %v",
		outage, wall.Round(time.Millisecond), n, r.count.Load(), cpu.Round(time.Millisecond), 100*cpu.Seconds()/wall.Seconds(), err)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Lock = %v, want DeadlineExceeded", err)
	}
	if err == nil || !strings.Contains(err.Error(), "last error") {
		t.Errorf("Lock = %v, want it to name the last cause", err)
	}
	if n > 15 {
		t.Errorf("%d connection attempts in %v, want ≤ 15", n, outage)
	}
	if cpu.Seconds() > 0.05*wall.Seconds() {
		t.Errorf("CPU %v in %v, want < 5%% of a core", cpu, wall)
	}
}

func cpuTime(t testing.TB) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Sessions are opened the way the pool opens connections: its
// BeforeConnect (here: the real user) and AfterConnect run for them.
func TestPoolHooksApply(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var after atomic.Int64
	pool := lazyPool(t, withUser(t, db.DSN, "no_such_role_y", "pw"), func(c *pgxpool.Config) {
		c.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
			cc.User = "postgres"
			return nil
		}
		c.AfterConnect = func(context.Context, *pgx.Conn) error {
			after.Add(1)
			return nil
		}
	})
	l := newLocker(t, pool, advisory.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lk, err := l.TryLock(ctx, pglocks.KeyOf("hooks"))
	if err != nil {
		t.Fatalf("TryLock with credentials from BeforeConnect: %v", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if after.Load() == 0 {
		t.Error("AfterConnect never ran for the Locker's session")
	}
}

// New opens no connection: the counting server sees none until a
// lock is asked for.
func TestNewOpensNothing(t *testing.T) {
	t.Parallel()
	r := newRejecter(t)
	l := newLocker(t, lazyPool(t, "postgres://postgres@"+r.ln.Addr().String()+"/x?sslmode=disable"), advisory.Config{})
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n := r.count.Load(); n > 0 {
			t.Fatalf("advisory.New opened %d connection(s)", n)
		}
		tick := time.NewTimer(10 * time.Millisecond)
		<-tick.C
	}
	_, _ = l.TryLock(ctxT(t), pglocks.KeyOf("new"))
	if r.count.Load() == 0 {
		t.Error("TryLock opened no connection")
	}
}
