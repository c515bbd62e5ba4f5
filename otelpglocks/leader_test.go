package otelpglocks_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/otelpglocks"
	"github.com/pglocks/pglocks/pgtest"
)

// TestLeaderStatus runs one term of a real election and checks the status
// gauge (1 while leading, 0 after) and the terms counter.
func TestLeaderStatus(t *testing.T) {
	t.Parallel()
	obs, reader := meter(t)
	db := pgtest.New(t)
	pool := db.NewPool(t)
	ctx := ctxT(t)
	store := newStore(t, pool, lease.Config{})
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	e, err := leader.New(leader.Config{Name: "metrics", Pool: pool, Store: store, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	election := otelpglocks.KeyElection.String("metrics")
	runCtx, stop := context.WithCancel(ctx)
	var during int64
	err = e.Run(runCtx, func(ctx context.Context, term leader.Term) error {
		during = collect(t, reader).sum("pglocks.leader.status", election)
		stop()
		<-ctx.Done()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	c := collect(t, reader)
	if during != 1 || c.sum("pglocks.leader.status", election) != 0 || c.sum("pglocks.leader.terms", election) != 1 {
		t.Errorf("status while leading %d, after %d, terms %d; want 1, 0, 1",
			during, c.sum("pglocks.leader.status", election), c.sum("pglocks.leader.terms", election))
	}
	// The elector's own Locker (Config.Locker nil) reports to the Observer
	// too: its advisory lock was taken and released.
	if got := c.sum("pglocks.acquire.attempts", kindAdvisory, result("acquired")); got < 1 {
		t.Errorf("advisory acquisitions through the elector's own Locker = %d, want ≥ 1", got)
	}
}

// TestCoreImportsNoOpenTelemetry checks that the core packages build
// without OpenTelemetry: only this adapter imports it.
func TestCoreImportsNoOpenTelemetry(t *testing.T) {
	t.Parallel()
	core := []string{"github.com/pglocks/pglocks", "github.com/pglocks/pglocks/advisory",
		"github.com/pglocks/pglocks/lease", "github.com/pglocks/pglocks/leader"}
	out, err := exec.Command("go", append([]string{"list", "-deps"}, core...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "go.opentelemetry.io/") {
			t.Errorf("a core package depends on %s", dep)
		}
	}
	if !strings.Contains(string(out), "github.com/jackc/pgx/v5") {
		t.Fatalf("go list -deps output does not look right:\n%s", out)
	}
}
