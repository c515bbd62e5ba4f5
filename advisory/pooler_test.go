package advisory_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
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

// TestTransactionPoolingRefused: behind a transaction-mode PgBouncer a
// Locker refuses session locks at once with ErrTransactionPooling (TryLock
// and a waiting Lock alike), and leaves no lock on any server session.
func TestTransactionPoolingRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, dsn := db.Bouncer(t, pgtest.PoolTransaction)
	pool := lazyPool(t, dsn, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec })
	l := newLocker(t, pool, advisory.Config{})
	ctx := ctxT(t)
	start := time.Now()
	if _, err := l.TryLock(ctx, pglocks.KeyOf("tx-pooled")); !errors.Is(err, advisory.ErrTransactionPooling) {
		t.Fatalf("TryLock behind transaction pooling: %v, want ErrTransactionPooling", err)
	}
	if _, err := l.Lock(ctx, pglocks.KeyOf("tx-pooled")); !errors.Is(err, advisory.ErrTransactionPooling) {
		t.Fatalf("Lock behind transaction pooling: %v, want ErrTransactionPooling", err)
	}
	t.Logf("refused in %v", time.Since(start).Round(time.Millisecond))
	if held, err := advisory.IsHeld(ctx, db.Conn(t), pglocks.KeyOf("tx-pooled")); err != nil || held {
		t.Fatalf("IsHeld after refusal = %v, %v", held, err)
	}
}

// TestXactThroughTransactionPooling: transaction locks exclude each other
// through a transaction-mode PgBouncer in each of pgx's exec modes.
func TestXactThroughTransactionPooling(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, dsn := db.Bouncer(t, pgtest.PoolTransaction)
	for name, mode := range map[string]pgx.QueryExecMode{
		"cache_statement": pgx.QueryExecModeCacheStatement,
		"cache_describe":  pgx.QueryExecModeCacheDescribe,
		"describe_exec":   pgx.QueryExecModeDescribeExec,
		"exec":            pgx.QueryExecModeExec,
		"simple_protocol": pgx.QueryExecModeSimpleProtocol,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := lazyPool(t, dsn, func(c *pgxpool.Config) {
				c.ConnConfig.DefaultQueryExecMode = mode
				c.MaxConns = 8
			})
			xactCounter(t, pool, pglocks.KeyOf("xact-pooled-"+name))
		})
	}
}

// xactCounter has goroutines increment a counter under XactLock, and
// checks TryXactLock sees a held key as ErrLocked.
func xactCounter(t *testing.T, pool *pgxpool.Pool, key pglocks.Key) {
	ctx := ctxT(t)
	const goroutines, iterations = 8, 40
	counter := 0 // unprotected on purpose: the lock protects it
	var wg sync.WaitGroup
	errs := make(chan error, goroutines+1)
	for range goroutines {
		wg.Go(func() {
			for range iterations {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if err := advisory.XactLock(ctx, tx, key); err != nil {
						return err
					}
					c := counter
					counter = c + 1
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := advisory.XactLock(ctx, tx, key); err != nil {
			return err
		}
		return pgx.BeginFunc(ctx, pool, func(tx2 pgx.Tx) error {
			if err := advisory.TryXactLock(ctx, tx2, key); !errors.Is(err, advisory.ErrLocked) {
				return fmt.Errorf("TryXactLock on a key another transaction holds: %v, want ErrLocked", err)
			}
			return nil
		})
	})
	errs <- err
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if counter != goroutines*iterations {
		t.Fatalf("counter = %d, want %d", counter, goroutines*iterations)
	}
}
