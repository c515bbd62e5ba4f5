package leader_test

import (
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/routetest"
)

// patroniReplica is a candidate's pool, Locker and Store on the cluster.
// With PGLOCKS_PATRONI_BOUNDED=1 its pool's connections bound themselves
// as the advisory sessions do — keepalives every second, and
// TCP_USER_TIMEOUT 10 s — so that a statement sent to a primary that was
// cut off fails instead of waiting for the kernel's retransmissions.
func patroniReplica(t *testing.T, dsn string) replica {
	t.Helper()
	if os.Getenv("PGLOCKS_PATRONI_BOUNDED") != "1" {
		return newReplica(t, dsn)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	d := routetest.Impatient(10 * time.Second)
	cfg.ConnConfig.DialFunc = d.DialContext
	pool, err := pgxpool.NewWithConfig(ctxT(t, time.Minute), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // after the Store and Locker close: cleanups run last first
	return replicaOn(t, pool, pool)
}
