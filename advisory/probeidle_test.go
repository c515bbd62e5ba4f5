package advisory_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// TestProbeSurvivesRoleIdleTimeout: a role whose idle_session_timeout is
// 1 s, and connections that take 2 s to open after the first (a slow
// network, TLS): the engine probe's first session idles while the probe
// opens its second connection, and must not be ended by the role's
// setting meanwhile (which was no verdict: the Locker refused to lock).
// The timeout is not shorter so that a loaded machine's stall between the
// first session's own statements, before it turns the timeout off, is not
// taken for the idle wait under test.
func TestProbeSurvivesRoleIdleTimeout(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	role := createRole(t, db, "idle_session_timeout = '1s'")
	var opened atomic.Int32
	pool := lazyPool(t, withUser(t, db.DSN, role, "right"), func(c *pgxpool.Config) {
		c.BeforeConnect = func(ctx context.Context, _ *pgx.ConnConfig) error {
			if opened.Add(1) == 1 {
				return nil
			}
			select { // a slow connect, not a synchronization
			case <-time.After(2 * time.Second):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	})
	l := newLocker(t, pool, advisory.Config{MaxSessions: 1})
	ctx := ctxT(t)
	lk, err := l.TryLock(ctx, pglocks.KeyOf("probe-idle"))
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
