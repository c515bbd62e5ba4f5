package lease_test

import (
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// Two lease tables of the same name in different schemas of one database
// do not hear each other: a Break in tenant_a does not end tenant_b's
// lease of the same name (before the fix, the default channel was the
// table name alone, so tenant_a's loss notice ended tenant_b's lease).
func TestSchemasDoNotShareLoss(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	stores := map[string]*lease.Store{}
	for _, schema := range []string{"tenant_a", "tenant_b"} {
		exec(t, b.pool, "create schema "+schema)
		s := newStore(t, b.pool, lease.Config{Schema: schema})
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		stores[schema] = s
	}
	la := mustTry(t, stores["tenant_a"], "job", time.Minute)
	lb := mustTry(t, stores["tenant_b"], "job", time.Minute)
	if la.Token() != lb.Token() {
		t.Fatalf("tokens %d and %d: the test wants equal ones", la.Token(), lb.Token())
	}
	poll(t, 30*time.Second, "both stores listening", func() bool {
		return lease.Listening(stores["tenant_a"]) && lease.Listening(stores["tenant_b"])
	})
	if _, err := stores["tenant_a"].Break(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, la.Context().Done(), 10*time.Second, "tenant_a's lease ending on its Break")
	select {
	case <-lb.Context().Done():
		t.Fatalf("tenant_b's healthy lease ended by tenant_a's Break: %v", lb.Err())
	case <-time.After(time.Second): // tenant_a's notice was delivered well within this
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
