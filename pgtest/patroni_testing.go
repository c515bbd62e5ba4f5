package pgtest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
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
		if t.Failed() {
			t.Log(p.keepLogs())
		}
		if err := p.Close(); err != nil {
			t.Errorf("pgtest: close Patroni: %v", err)
		}
	})
	t.Logf("pgtest: Patroni cluster of %d nodes ready in %v (primary %s)", len(p.nodes), time.Since(start).Round(time.Millisecond), p.Primary(ctx))
	return p
}

// keepLogs copies every log of the cluster (etcd, HAProxy, each Patroni
// with its PostgreSQL) out of the dir Close removes, and says where.
func (p *Patroni) keepLogs() string {
	dst, err := os.MkdirTemp("", "pgtest-patroni-logs-")
	if err != nil {
		return "pgtest: Patroni logs not kept: " + err.Error()
	}
	logs, _ := filepath.Glob(filepath.Join(p.dir, "*.log"))
	for _, l := range logs {
		if b, err := os.ReadFile(l); err == nil {
			_ = os.WriteFile(filepath.Join(dst, filepath.Base(l)), b, 0o644)
		}
	}
	return "pgtest: the Patroni cluster's logs are kept in " + dst
}
