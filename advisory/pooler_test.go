package advisory_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/pgtest"
)

// viaSessionBouncer names the test whose subtests run the behaviour tests
// through a session-mode PgBouncer.
const viaSessionBouncer = "TestViaSessionBouncer/"

// poolFor opens the pool a behaviour test's Lockers use: directly on db,
// or through a session-mode PgBouncer when the test runs under
// TestViaSessionBouncer. Checks that read pg_locks still connect directly.
func poolFor(t testing.TB, db *pgtest.DB) *pgxpool.Pool {
	t.Helper()
	if !strings.HasPrefix(t.Name(), viaSessionBouncer) {
		return db.NewPool(t)
	}
	_, dsn := db.Bouncer(t, pgtest.PoolSession)
	return lazyPool(t, dsn)
}

// TestViaSessionBouncer runs the advisory behaviour tests with every
// Locker session (and the LISTEN connection) opened through a real
// PgBouncer in session mode: no startup parameter it rejects, locks held,
// excluded, unlocked, lost and announced as over a direct connection.
func TestViaSessionBouncer(t *testing.T) {
	t.Parallel()
	for name, test := range map[string]func(*testing.T){
		"TryLock":                       TestTryLock,
		"Exclusion":                     TestExclusion,
		"LockHonoursContext":            TestLockHonoursContext,
		"DoReleasesOnPanic":             TestDoReleasesOnPanic,
		"CloseReleases":                 TestCloseReleases,
		"UnlockWithDoneContext":         TestUnlockWithDoneContext,
		"CloseUnderLoad":                TestCloseUnderLoad,
		"LossAfterTerminateBackend":     TestLossAfterTerminateBackend,
		"DoCancelledOnLoss":             TestDoCancelledOnLoss,
		"UnlockedLockIsNotLost":         TestUnlockedLockIsNotLost,
		"TryLockAfterIdleSessionDied":   TestTryLockAfterIdleSessionDied,
		"SharedExclusiveMatrix":         TestSharedExclusiveMatrix,
		"WriterNotStarved":              TestWriterNotStarved,
		"XactLock":                      TestXactLock,
		"ManyKeysFewConnections":        TestManyKeysFewConnections,
		"LockSurvivesTerminatedSession": TestLockSurvivesTerminatedSession,
		"PsqlInterop":                   TestPsqlInterop,
		"BadInputNoPanic":               TestBadInputNoPanic,
		"VerifiedAt":                    TestVerifiedAt,
	} {
		t.Run(name, test)
	}
}
