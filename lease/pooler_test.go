package lease_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/pgtest"
)

// viaTransactionBouncer names the test whose subtests run the lease
// behaviour tests through a transaction-mode PgBouncer, one subtest per
// pgx exec mode: TestViaTransactionBouncer/<mode>/<test>.
const viaTransactionBouncer = "TestViaTransactionBouncer/"

var execModes = map[string]pgx.QueryExecMode{
	"cache_statement": pgx.QueryExecModeCacheStatement,
	"cache_describe":  pgx.QueryExecModeCacheDescribe,
	"describe_exec":   pgx.QueryExecModeDescribeExec,
	"exec":            pgx.QueryExecModeExec,
	"simple_protocol": pgx.QueryExecModeSimpleProtocol,
}

// poolFor opens the pool a behaviour test's store uses: directly on db, or
// through a transaction-mode PgBouncer with the exec mode the test's name
// says when it runs under TestViaTransactionBouncer. Checks through
// db.Conn still connect directly.
func poolFor(t testing.TB, db *pgtest.DB) *pgxpool.Pool {
	t.Helper()
	rest, ok := strings.CutPrefix(t.Name(), viaTransactionBouncer)
	if !ok {
		return db.NewPool(t)
	}
	mode, ok := execModes[strings.Split(rest, "/")[0]]
	if !ok {
		t.Fatalf("no exec mode in test name %q", t.Name())
	}
	_, dsn := db.Bouncer(t, pgtest.PoolTransaction)
	return pgtest.NewPool(t, dsn, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
}

// TestViaTransactionBouncer runs the lease behaviour tests through a real
// PgBouncer in transaction mode (PgBouncer 1.18 keeps no prepared
// statements there), once in each of pgx's five exec modes.
func TestViaTransactionBouncer(t *testing.T) {
	t.Parallel()
	tests := map[string]func(*testing.T){
		"TryAcquire":               TestTryAcquire,
		"TokensOnlyGrow":           TestTokensOnlyGrow,
		"ConcurrentTries":          TestConcurrentTries,
		"FailedTryWritesNothing":   TestFailedTryWritesNothing,
		"AcquireWaitsForRelease":   TestAcquireWaitsForRelease,
		"AcquireWakesAtExpiry":     TestAcquireWakesAtExpiry,
		"AcquireCancelled":         TestAcquireCancelled,
		"GuardStaleHolder":         TestGuardStaleHolder,
		"GuardedCounterStress":     TestGuardedCounterStress,
		"RenewExtends":             TestRenewExtends,
		"ReleaseTwice":             TestReleaseTwice,
		"RenewLosesLease":          TestRenewLosesLease,
		"KeepAliveRenews":          TestKeepAliveRenews,
		"KeepAliveDetectsTakeover": TestKeepAliveDetectsTakeover,
		"Inspect":                  TestInspect,
		"Do":                       TestDo,
	}
	for mode := range execModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			for name, test := range tests {
				t.Run(name, test)
			}
		})
	}
}
