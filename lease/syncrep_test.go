package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// TestSyncCommitCutShort pins a behaviour of PostgreSQL that a failover
// exposes, and the read that is safe from it. On a primary with a
// synchronous standby a commit waits for the standby's flush, invisible to
// other sessions meanwhile. If its backend is terminated (or its query
// cancelled) during that wait, the transaction stays committed locally and
// becomes visible at once although the standby never got it; a promotion
// then loses it. So a plain read can return a value that a failover takes
// back. A read that locks the row (FOR SHARE) writes WAL, so its commit
// waits for the standby like any write: once it returns, what it read is
// on the standby too. The chaos suite's promotion runs read that way
// (chaos.TestLeasePromoteChaos), and Guard's check is such a lock.
func TestSyncCommitCutShort(t *testing.T) {
	t.Parallel()
	c, db, pool := newCluster(t, pgtest.WithSynchronousStandby())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("create table cut (v int)")
	exec("insert into cut values (1)")
	if err := c.PauseReplication(ctx); err != nil {
		t.Fatal(err)
	}

	// A write whose commit waits for the standby, then is cut short.
	wrote := make(chan error, 1)
	go func() { _, err := pool.Exec(ctx, "update cut set v = 2"); wrote <- err }()
	writer := waitSyncRep(t, ctx, pool)
	if v := readCut(t, ctx, pool); v != 1 {
		t.Fatalf("a commit waiting for the standby was visible: read %d", v)
	}
	if err := db.Server.TerminateBackend(ctx, writer); err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err == nil {
		t.Fatal("the writer got an answer although its backend was terminated in the wait")
	}
	if v := readCut(t, ctx, pool); v != 2 {
		t.Fatalf("after the wait was cut short a plain read saw %d, want 2 (committed locally)", v)
	}

	// A locking read of the same row waits for the standby as a write does.
	locked := make(chan error, 1)
	go func() {
		locked <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "select v from cut for share")
			return err
		})
	}()
	waitSyncRep(t, ctx, pool)
	select {
	case err := <-locked:
		t.Fatalf("a FOR SHARE read returned (%v) before the standby had the write it saw", err)
	default:
	}

	if _, err := c.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-locked; err == nil {
		t.Fatal("the FOR SHARE read was acknowledged though the promotion lost what it read")
	}
	if v := readCut(t, ctx, db.NewPool(t)); v != 1 {
		t.Fatalf("after the promotion the row reads %d, want 1: the cut-short commit should be lost", v)
	}
}

// waitSyncRep waits until a session of pool's database waits for the
// synchronous standby and returns its pid.
func waitSyncRep(t *testing.T, ctx context.Context, pool *pgxpool.Pool) uint32 {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var pid uint32
		err := pool.QueryRow(ctx, `select pid from pg_stat_activity
			where datname = current_database() and wait_event = 'SyncRep' limit 1`).Scan(&pid)
		if err == nil {
			return pid
		}
		if !errors.Is(err, pgx.ErrNoRows) || time.Now().After(deadline) {
			t.Fatalf("no session waits for the synchronous standby: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition under a deadline
	}
}

func readCut(t *testing.T, ctx context.Context, pool *pgxpool.Pool) int {
	t.Helper()
	var v int
	if err := pool.QueryRow(ctx, "select v from cut").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestSyncCutShortAcquisition: an acquisition whose commit is cut short
// while it waits for the synchronous standby is visible on the primary, so
// another Store reads its token in a HeldError; the promotion loses it and
// the new primary hands that token out again. The Store that saw it refuses
// the reissue (a RegressionError: a false alarm, on the safe side, since no
// caller ever held the lost acquisition), and the next acquisition is above.
func TestSyncCutShortAcquisition(t *testing.T) {
	t.Parallel()
	c, db, pool := newCluster(t, pgtest.WithSynchronousStandby())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// The cut store's sessions ask for remote_write: its cleanup of the
	// cut-short attempt, a release, then waits for the paused standby too
	// and stays invisible, rather than free the name before seer looks
	// (at on, a release does not wait for its flush or the standby).
	cutPool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["synchronous_commit"] = "remote_write" })
	cut, seer := newStore(t, cutPool, lease.Config{}), newStore(t, pool, lease.Config{})
	if err := c.PauseReplication(ctx); err != nil {
		t.Fatal(err)
	}
	tried := make(chan error, 1)
	go func() { _, err := cut.TryAcquire(ctx, "cut", time.Minute); tried <- err }()
	if err := db.Server.TerminateBackend(ctx, waitSyncRep(t, ctx, pool)); err != nil {
		t.Fatal(err)
	}
	if err := <-tried; err == nil {
		t.Fatal("the acquisition was acknowledged although its session was terminated in the wait")
	}
	_, err := seer.TryAcquire(ctx, "cut", time.Minute)
	var held *lease.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("another store's try: %v, want a HeldError showing the cut-short acquisition", err)
	}
	if _, err := c.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = seer.Acquire(ctx, "cut", time.Minute)
	var re *lease.RegressionError
	if !errors.As(err, &re) || re.Token != held.Token {
		t.Fatalf("acquire after the promotion: %v, want a RegressionError for token %d", err, held.Token)
	}
	l, err := seer.Acquire(ctx, "cut", time.Minute)
	if err != nil || l.Token() <= held.Token {
		t.Fatalf("acquire after the refusal: %v (token above %d wanted)", err, held.Token)
	}
	t.Logf("cut-short token %d, seen in a HeldError, refused when reissued; next token %d", held.Token, l.Token())
}

// TestSyncCancelledCommit pins the other way a commit is cut short, and
// the Store's answer to it. A query cancel (pgx's
// CancelRequestContextWatcherHandler sends one when ctx ends) that finds
// the commit waiting for the synchronous standby ends the wait with a
// WARNING and reports success — although the standby never got the commit,
// and a promotion loses it. So the Store trusts no acquisition or renewal
// whose success arrived after its ctx ended: TryAcquire returns an unknown
// outcome (and cleans up), Renew extends nothing.
func TestSyncCancelledCommit(t *testing.T) {
	t.Parallel()
	c, db, _ := newCluster(t, pgtest.WithSynchronousStandby())
	pool := db.NewPool(t, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: time.Minute}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := newStore(t, pool, lease.Config{})
	held, err := s.TryAcquire(ctx, "renewed", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "create table cancelled (v int); insert into cancelled values (1)"); err != nil {
		t.Fatal(err)
	}
	if err := c.PauseReplication(ctx); err != nil {
		t.Fatal(err)
	}
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 300*time.Millisecond) }

	sctx, scancel := short()
	_, err = pool.Exec(sctx, "update cancelled set v = 2")
	scancel()
	if err != nil {
		t.Fatalf("a plain update cancelled in the wait: %v; PostgreSQL acknowledges it", err)
	}
	sctx, scancel = short()
	l, err := s.TryAcquire(sctx, "cancelled", time.Minute)
	scancel()
	if err == nil {
		t.Fatalf("TryAcquire acknowledged token %d after its ctx ended: a promotion may lose it", l.Token())
	}
	before := held.TrustedUntil()
	sctx, scancel = short()
	err = held.Renew(sctx)
	scancel()
	if err == nil || held.TrustedUntil().After(before) {
		t.Fatalf("Renew acknowledged after its ctx ended (%v): trust moved from %v to %v", err, before, held.TrustedUntil())
	}
	if _, err := c.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	var v int
	if err := db.NewPool(t).QueryRow(ctx, "select v from cancelled").Scan(&v); err != nil || v != 1 {
		t.Fatalf("after the promotion: v = %d, %v; want 1 (the acknowledged update lost)", v, err)
	}
	t.Logf("renew acknowledged after ctx ended: %v", err)
}
