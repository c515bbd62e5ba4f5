package pooler_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglocks/pglocks/internal/pooler"
	"github.com/pglocks/pglocks/pgtest"
)

// setting is one pooler setup of the matrix and what the probe must say.
type setting struct {
	name  string
	start func(t *testing.T, db *pgtest.DB) string // returns the DSN through it
	want  pooler.Mode
	pool  int // server sessions per client pool; 0: unbounded
}

func settings() []setting {
	var out []setting
	for _, mode := range []pgtest.PoolMode{pgtest.PoolSession, pgtest.PoolTransaction, pgtest.PoolStatement} {
		want := map[pgtest.PoolMode]pooler.Mode{pgtest.PoolSession: pooler.Session,
			pgtest.PoolTransaction: pooler.Transaction, pgtest.PoolStatement: pooler.Statement}[mode]
		for _, fifo := range []bool{false, true} {
			for _, size := range []int{1, 2, 3, 20} {
				opts := []pgtest.BouncerOption{pgtest.BouncerPoolSize(size)}
				order := "LIFO"
				if fifo {
					opts, order = append(opts, pgtest.BouncerRoundRobin()), "FIFO"
				}
				out = append(out, setting{
					name: fmt.Sprintf("PgBouncer/%s/%s/pool%d", mode, order, size), want: want, pool: size,
					start: func(t *testing.T, db *pgtest.DB) string {
						_, dsn := db.Bouncer(t, mode, opts...)
						warm(t, dsn, min(size, 3))
						return dsn
					},
				})
			}
		}
	}
	for _, cache := range []bool{false, true} {
		// Pgpool-II announces its backend's pid: the probe sees no pooler,
		// and rightly treats it as one (each client keeps its backend).
		// Leases need the simple protocol there: TestPgpoolLeavesDMLOpen.
		out = append(out, setting{name: fmt.Sprintf("Pgpool/cache=%v", cache), want: pooler.Direct,
			start: func(t *testing.T, db *pgtest.DB) string {
				_, dsn := db.Pgpool(t, cache)
				return dsn + "&default_query_exec_mode=simple_protocol"
			}})
	}
	return out
}

// TestPoolerMatrix runs the pooler probe and every user of it — the
// advisory Locker, the lease store's listener, leader's Observe and an
// elector in ModeAuto — behind PgBouncer in session, transaction and
// statement mode, reusing idle server sessions most recently used first
// (LIFO, PgBouncer's default) and in turn (FIFO, server_round_robin), with
// pools of 1, 2, 3 and 20 server sessions, and behind Pgpool-II. Each
// user's verdict is checked by what the server shows: a session lock held
// where sessions are kept, refused and absent from pg_locks where they
// move; LISTEN and interest locks on the server, or a logged fall back to
// polling.
func TestPoolerMatrix(t *testing.T) {
	t.Parallel()
	for _, s := range settings() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t) // a database each: the checks count its advisory locks
			migrate(t, db)
			dsn := s.start(t, db)
			if s.want == pooler.Session && s.pool == 1 {
				// The probe's second connection cannot get a server
				// session: it must fail within its ctx, never say pooled.
				m, err := probeErr(t, dsn, 3*time.Second)
				if err == nil && m != pooler.Session {
					t.Fatalf("probe says %v", m)
				}
				t.Logf("probe: %v, %v", m, err)
				return
			}
			for i := range 3 {
				if m := probe(t, dsn); m != s.want {
					t.Fatalf("probe %d says %v, want %v", i, m, s.want)
				}
			}
			if s.want == pooler.Session && s.pool < 20 {
				return // too few server sessions for a Locker, a store and an elector at once
			}
			keeps := s.want.KeepsSession()
			checkLocker(t, db, dsn, keeps)
			checkListener(t, db, dsn, keeps)
			checkElector(t, db, dsn, keeps)
		})
	}
}

// TestPgpoolLeavesDMLOpen pins a Pgpool-II behaviour that docs/poolers.md
// warns of (pgpool2 issue 172): in raw mode an UPDATE sent with the
// extended protocol — pgx's default exec mode — runs in a transaction
// pgpool opens and does not commit, so the row stays locked and unchanged
// for everyone else until the client leaves; the simple protocol commits.
// Should a pgpool fix this, the test fails and the warning can go.
func TestPgpoolLeavesDMLOpen(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, dsn := db.Pgpool(t, false)
	ctx := ctxFor(t, time.Minute)
	direct := db.Conn(t)
	if _, err := direct.Exec(ctx, "create table pinned (id int primary key, v int); insert into pinned values (1, 0)"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		mode      string
		committed bool
	}{{"cache_statement", false}, {"simple_protocol", true}} {
		conn, err := pgx.Connect(ctx, dsn+"&default_query_exec_mode="+c.mode)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "update pinned set v = v + 1 where id = $1", 1); err != nil {
			t.Fatal(err)
		}
		var open bool
		if err := direct.QueryRow(ctx, `select exists (select from pg_stat_activity
			where datname = current_database() and state = 'idle in transaction')`).Scan(&open); err != nil {
			t.Fatal(err)
		}
		if open == c.committed {
			t.Errorf("%s through Pgpool-II: a transaction left open: %v, want %v", c.mode, open, !c.committed)
		}
		_ = conn.Close(ctx)
	}
}
