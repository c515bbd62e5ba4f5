package pgtest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pglocks/pglocks/pgtest"
)

// A test that fails a Patroni cluster's primary over by SIGKILL of the
// node, measures Patroni's part, and lets the cluster recover before the
// next fault. (Not run here: it needs PGLOCKS_PATRONI=1 and a testing.T.)
func ExamplePatroni_Fault() {
	failover := func(t *testing.T) {
		p := pgtest.NewPatroni(t, pgtest.PatroniOptions{TTL: 20})
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		fo, err := p.Fault(ctx, pgtest.FaultKillNode)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("%s → %s writable after %v\n", fo.Old, fo.New, fo.Writable)
		if err := fo.Recover(ctx); err != nil { // restarts the old node, waits for a synchronous standby
			t.Fatal(err)
		}
	}
	_ = failover
}
