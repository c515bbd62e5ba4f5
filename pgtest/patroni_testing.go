package pgtest

import (
	"context"
	"errors"
	"testing"
	"time"
)

// NewPatroni starts a [Patroni] cluster for t (see [StartPatroni]) and
// closes it when the test ends. It skips t where Patroni, etcd or HAProxy
// is not installed, and fails it if the cluster elects no primary within
// three minutes (the error shows Patroni's view of the cluster).
func NewPatroni(t testing.TB, o PatroniOptions) *Patroni {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	p, err := StartPatroni(ctx, o)
	if errors.Is(err, ErrNoPatroni) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("pgtest: close Patroni: %v", err)
		}
	})
	t.Logf("pgtest: Patroni cluster of %d nodes ready in %v (primary %s)", len(p.nodes), time.Since(start).Round(time.Millisecond), p.Primary(ctx))
	return p
}
