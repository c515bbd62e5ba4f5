package pgtest_test

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

// What a sweep must never drop, and what must not stop a run from
// starting, on a server that outlives runs (PGTEST_DSN).

func dbExists(t *testing.T, dsn, name string) bool {
	t.Helper()
	conn := connect(t, dsn)
	var ok bool
	if err := conn.QueryRow(ctxT(t, 30*time.Second), "select exists(select 1 from pg_database where datname = $1)", name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func execAll(t *testing.T, dsn string, sqls ...string) {
	t.Helper()
	conn := connect(t, dsn)
	for _, sql := range sqls {
		if _, err := conn.Exec(ctxT(t, 30*time.Second), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

func withUser(t *testing.T, dsn, user string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(user)
	return u.String()
}

// A run whose DSN names another maintenance database still sees a live
// run: liveness is judged server-wide, not by a lock in one database.
func TestSweepRegressOtherMaintenanceDB(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t)
	execAll(t, srv.DSN(), "create database other_maint")
	a := runOn(t, srv.DSN())
	defer a.Close()
	db, err := a.CreateDatabase(ctxT(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	b := runOn(t, srv.ConnString("other_maint"))
	defer b.Close()
	if !dbExists(t, srv.DSN(), db.Name) {
		t.Fatalf("a run on another maintenance database dropped the live run's database %s", db.Name)
	}
}

// A server whose idle_session_timeout ends idle sessions does not end a
// live run's lock session.
func TestSweepRegressIdleSessionTimeout(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t)
	execAll(t, srv.DSN(), "alter system set idle_session_timeout = '1s'", "select pg_reload_conf()")
	a := runOn(t, srv.DSN())
	defer a.Close()
	db, err := a.CreateDatabase(ctxT(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	// A canary session opened after the run's lock session: once the
	// server has ended it for idling, it would have ended the lock
	// session too, had that one kept the server's setting.
	ctx := ctxT(t, time.Minute)
	canary, err := pgx.Connect(ctx, srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	pid := canary.PgConn().PID()
	defer canary.Close(context.Background())
	watch, err := pgx.Connect(ctx, srv.DSN()+"&options=-c%20idle_session_timeout%3D0")
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(context.Background())
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for gone := false; !gone; {
		if err := watch.QueryRow(ctx, "select not exists(select from pg_stat_activity where pid = $1)", pid).Scan(&gone); err != nil {
			t.Fatal(err)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal("the canary session was never ended")
		}
	}
	b := runOn(t, srv.DSN())
	defer b.Close()
	if !dbExists(t, srv.DSN(), db.Name) {
		t.Fatalf("live run's database %s dropped: its lock session hit idle_session_timeout", db.Name)
	}
}

// Through a transaction-mode pooler a session lock sits on a server
// session that other clients are lent: no run there may sweep. Runs start
// there whether the pooler lends one server session or several in turn.
func TestSweepRegressThroughTxPooler(t *testing.T) {
	t.Parallel()
	for _, opts := range [][]pgtest.BouncerOption{
		{pgtest.BouncerPoolSize(1)},
		{pgtest.BouncerPoolSize(3), pgtest.BouncerRoundRobin()},
	} {
		sweepThroughTxPooler(t, opts)
	}
}

func sweepThroughTxPooler(t *testing.T, opts []pgtest.BouncerOption) {
	srv := pgtest.NewServer(t)
	bo := pgtest.NewBouncer(t, srv, pgtest.PoolTransaction, opts...)
	dsn, err := bo.DSN(srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	dsn += "&default_query_exec_mode=simple_protocol"
	a := runOn(t, dsn)
	defer a.Close()
	db, err := a.CreateDatabase(ctxT(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	b := runOn(t, dsn)
	defer b.Close()
	if !dbExists(t, srv.DSN(), db.Name) {
		t.Fatalf("live run's database %s dropped by a run through the same transaction pooler", db.Name)
	}
}

// A dead run's database that the role may not drop does not stop a run
// from starting: the sweep leaves it.
func TestSweepRegressForeignOwner(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t)
	execAll(t, srv.DSN(), "create role alice login createdb", "create role bob login createdb")
	execAll(t, withUser(t, srv.DSN(), "alice"), "create database pgtest_0badcafe_0123456789ab")
	s, err := pgtest.Start(ctxT(t, time.Minute), pgtest.WithDSN(withUser(t, srv.DSN(), "bob")))
	if err != nil {
		t.Fatalf("bob cannot start a run because of alice's leftover: %v", err)
	}
	s.Close()
	if !dbExists(t, srv.DSN(), "pgtest_0badcafe_0123456789ab") {
		t.Fatal("bob's run dropped alice's database")
	}
}

// The sweep drops only names pgtest makes, and no database anyone is
// connected to.
func TestSweepRegressNamesAndSessions(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t)
	execAll(t, srv.DSN(), "create database pgtest_deadbeef_prod", "create database pgtest_deadbeef_0123456789ab",
		"create database pgtest_deadbeef_ba9876543210")
	busy := connect(t, srv.ConnString("pgtest_deadbeef_0123456789ab"))
	s := runOn(t, srv.DSN())
	defer s.Close()
	if !dbExists(t, srv.DSN(), "pgtest_deadbeef_prod") {
		t.Error("the sweep dropped a database pgtest did not make (name pgtest_deadbeef_prod)")
	}
	if !dbExists(t, srv.DSN(), "pgtest_deadbeef_0123456789ab") {
		t.Error("the sweep dropped a database with a session on it")
	}
	if dbExists(t, srv.DSN(), "pgtest_deadbeef_ba9876543210") {
		t.Error("the sweep left a dead run's idle database")
	}
	_ = busy
}

// slowMigrator is a Migrator that takes a while.
type slowMigrator struct{ token string }

func (m slowMigrator) Hash() (string, error) { return "regress-slow-" + m.token, nil }
func (m slowMigrator) Migrate(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, "select pg_sleep(3)"); err != nil {
		return err
	}
	_, err := conn.Exec(ctx, "create table made (x int)")
	return err
}

// Two binaries whose DSNs name different maintenance databases make the
// same template at once: both get a complete one.
func TestTemplateRegressOtherMaintenanceDB(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t)
	execAll(t, srv.DSN(), "create database other_maint")
	m := slowMigrator{pgtest.RandomToken()}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, dsn := range []string{srv.DSN(), srv.ConnString("other_maint")} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := pgtest.Start(context.Background(), pgtest.WithDSN(dsn), pgtest.WithMigrator(m))
			if err != nil {
				errs[i] = err
				return
			}
			defer s.Close()
			db, err := s.CreateDatabase(context.Background())
			if err == nil {
				var c *pgx.Conn
				if c, err = pgx.Connect(context.Background(), db.DSN); err == nil {
					_, err = c.Exec(context.Background(), "select * from made")
					_ = c.Close(context.Background())
				}
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("binary %d: %v", i, err)
		}
	}
}

// A run whose lock session is terminated takes its lock back on a new
// session; while another session holds the lock it cannot, and Close says
// so.
func TestSweepRegressLockRetaken(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t)
	a := runOn(t, srv.DSN())
	defer a.Close()
	db, err := a.CreateDatabase(ctxT(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	run := strings.Split(db.Name, "_")[1]
	key, _ := strconv.ParseUint(run, 16, 32)
	ctx := ctxT(t, 2*time.Minute)
	admin := connect(t, srv.DSN())
	holder := func() (pid int32) {
		t.Helper()
		err := admin.QueryRow(ctx, `select coalesce(max(pid), 0) from pg_locks where locktype = 'advisory'
			and classid = x'70677472'::int::oid and objid = $1::int8::oid and objsubid = 2 and granted`, key).Scan(&pid)
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	first := holder()
	if first == 0 {
		t.Fatal("no backend holds the run's lock")
	}
	// A waiter queued on the lock gets it the moment the run's session
	// ends, before the run's watchdog can take it back.
	waiter := connect(t, srv.DSN())
	waited := make(chan error, 1)
	go func() {
		_, err := waiter.Exec(ctx, "select pg_advisory_lock($1::int4, $2::int4)", 0x70677472, int32(uint32(key)))
		waited <- err
	}()
	for queued := false; !queued; {
		if err := admin.QueryRow(ctx, `select exists(select from pg_locks where locktype = 'advisory'
			and objid = $1::int8::oid and not granted)`, key).Scan(&queued); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.Exec(ctx, "select pg_terminate_backend($1)", first); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	for pgtest.RunLockLostForTest(a) == nil {
		if ctx.Err() != nil {
			t.Fatal("the run never noticed its lock lost")
		}
		time.Sleep(50 * time.Millisecond) // polling a condition, with a deadline
	}
	if _, err := waiter.Exec(ctx, "select pg_advisory_unlock_all()"); err != nil {
		t.Fatal(err)
	}
	for pid := holder(); pid == 0 || pid == first; pid = holder() {
		if ctx.Err() != nil {
			t.Fatal("the run never took its lock back")
		}
		time.Sleep(50 * time.Millisecond) // polling a condition, with a deadline
	}
	if err := a.Close(); err == nil || !strings.Contains(err.Error(), "lost") {
		t.Fatalf("Close: %v, want an error saying the run's lock was lost", err)
	}
}
