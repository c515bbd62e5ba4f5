package leader_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/internal/logtest"
	"github.com/pglocks/pglocks/leader"
)

// TestFollowerBehindLeaderStopsCleanly: a follower whose advisory session
// waits behind the live leader — the server answers its tries "held" —
// has reached the database even if every read of the lease row failed
// (here its Store's role is at its connection limit: 53300), so when its
// ctx ends Run returns nil, not "Run stopped before any campaign reached
// the database". Its reads failing while its tries are answered log one
// Warn, not one per read and answer.
func TestFollowerBehindLeaderStopsCleanly(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := ctxT(t, time.Minute)
	a := startCandidate(t, newReplica(t, db.DSN), "behind", "a", nil)
	waitEvent(t, a.elected, "a's election")

	admin := db.Conn(t)
	role := fmt.Sprintf("leader_follower_%d", time.Now().UnixNano())
	ident := pgx.Identifier{role}.Sanitize()
	if _, err := admin.Exec(ctx, "create role "+ident+" login connection limit 0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := db.Conn(t).Exec(ctx, "drop role "+ident); err != nil {
			t.Logf("drop role %s: %v", role, err)
		}
	})
	cfg, err := pgxpool.ParseConfig(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.MinConns = role, 0
	limited, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(limited.Close)
	app := "follower-" + db.Name
	locker, err := advisory.New(db.NewPool(t), advisory.Config{ApplicationName: app})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = locker.Close(context.Background()) })
	// The Locker's first connection proves the server's locks exclude by
	// sending its own try and unlock statements: have that done, and the
	// session's last statement be an unlock, before the follower's tries
	// are looked for below.
	warm, err := locker.TryLock(ctx, pglocks.KeyOf("warm-up"))
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	rec, log := logtest.New()
	b, err := leader.New(leader.Config{Name: "behind", Pool: limited, Locker: locker, Identity: "b",
		RetryInterval: 50 * time.Millisecond, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	bctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.Run(bctx, func(context.Context, leader.Term) error { return nil }) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var tried bool
		err := admin.QueryRow(ctx, `select exists (select from pg_stat_activity
			where application_name = $1 and query ilike '%pg_try_advisory%')`, app).Scan(&tried)
		if err != nil {
			t.Fatal(err)
		}
		if tried && b.State().LastError != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the follower's session never tried the lock, or no read of the lease failed (state: %+v)", b.State())
		}
		<-time.After(20 * time.Millisecond) // polling a condition with a deadline
	}
	t.Logf("follower's last error: %v", b.State().LastError)
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run of a follower that waited behind the live leader = %v, want nil", err)
	}
	// Its reads kept failing while its tries were answered: one Warn.
	var warns []logtest.Record
	for _, r := range rec.Records() {
		if r.Level >= slog.LevelWarn {
			warns = append(warns, r)
		}
	}
	if len(warns) != 1 {
		t.Errorf("%d records at Warn or above, want 1 (the reads failing): %v", len(warns), warns[:min(len(warns), 4)])
	}
}

// TestUnreachableWarnsOnce: a candidate that cannot reach the database
// logs one Warn with the cause, and its later failures at Debug, however
// short its RetryInterval (here 10 ms: before, a Warn every 10 ms), in
// either mode.
func TestUnreachableWarnsOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range []leader.Mode{leader.ModeAuto, leader.ModeLeaseOnly} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			rec, log := logtest.New()
			e, err := leader.New(leader.Config{Name: "unreachable", Pool: unreachablePool(t), Mode: mode,
				RetryInterval: 10 * time.Millisecond, Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = e.Close(context.Background()) })
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			_ = e.Run(ctx, func(context.Context, leader.Term) error { return nil })
			var warns, failures []logtest.Record
			for _, r := range rec.Records() {
				if r.Level >= slog.LevelWarn {
					warns = append(warns, r)
				}
				if strings.Contains(r.Msg, "failed") {
					failures = append(failures, r)
				}
			}
			t.Logf("%d failures logged, %d records at Warn or above: %v", len(failures), len(warns), warns[:min(len(warns), 3)])
			if len(failures) < 5 {
				t.Fatalf("only %d failures logged in 1s with RetryInterval 10ms", len(failures))
			}
			if len(warns) != 1 || !strings.Contains(warns[0].Attrs["err"], "refused") {
				t.Errorf("%d records at Warn or above, want 1 naming the cause", len(warns))
			}
		})
	}
}
