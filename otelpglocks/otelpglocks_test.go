package otelpglocks_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/otelpglocks"
	"github.com/pglocks/pglocks/pgtest"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// meter returns an Observer recording into a real SDK MeterProvider, and
// the reader that collects from it.
func meter(t *testing.T, opts ...otelpglocks.Option) (*pglocks.Observer, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	obs, err := otelpglocks.New(append(opts, otelpglocks.WithMeterProvider(mp))...)
	if err != nil {
		t.Fatal(err)
	}
	return obs, reader
}

// collected is one collection, indexed by instrument name.
type collected map[string]metricdata.Aggregation

func collect(t *testing.T, r *sdkmetric.ManualReader) collected {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	c := collected{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			c[m.Name] = m.Data
		}
	}
	return c
}

// matches reports whether set has every attribute of want.
func matches(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// sum adds up the points of a counter, updown counter or gauge with the
// attributes want.
func (c collected) sum(name string, want ...attribute.KeyValue) int64 {
	var n int64
	switch d := c[name].(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				n += p.Value
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				n += p.Value
			}
		}
	}
	return n
}

// count is the number of measurements of a histogram with attributes want.
func (c collected) count(name string, want ...attribute.KeyValue) uint64 {
	var n uint64
	if d, ok := c[name].(metricdata.Histogram[float64]); ok {
		for _, p := range d.DataPoints {
			if matches(p.Attributes, want) {
				n += p.Count
			}
		}
	}
	return n
}

var (
	kindLease    = otelpglocks.KeyKind.String("lease")
	kindAdvisory = otelpglocks.KeyKind.String("advisory")
)

func result(r string) attribute.KeyValue { return otelpglocks.KeyResult.String(r) }
func reason(r string) attribute.KeyValue { return otelpglocks.KeyReason.String(r) }

// TestLeaseScript records one scripted run on a real server — three
// acquisitions, one busy try, one loss (a Break), one release, one
// renewal — and checks every value the SDK collected.
func TestLeaseScript(t *testing.T) {
	t.Parallel()
	obs, reader := meter(t)
	db := pgtest.New(t)
	pool := db.NewPool(t)
	ctx := ctxT(t)
	store := newStore(t, pool, lease.Config{Observer: obs})
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	other := newStore(t, pool, lease.Config{}) // not observed
	if _, err := other.TryAcquire(ctx, "held-elsewhere", time.Minute); err != nil {
		t.Fatal(err)
	}
	var ls []*lease.Lease
	for _, name := range []string{"a", "b", "c"} {
		l, err := store.TryAcquire(ctx, name, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	if _, err := store.TryAcquire(ctx, "held-elsewhere", time.Minute); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("TryAcquire of a held lease = %v, want ErrHeld", err)
	}
	if err := ls[2].Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Break(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	_ = ls[0].Renew(ctx) // ErrNotHeld, unless the Break's NOTIFY ended it first
	waitClosed(t, ls[0].Lost(), "the broken lease's loss")
	if err := ls[1].Release(ctx); err != nil {
		t.Fatal(err)
	}

	c := collect(t, reader)
	checks := []struct {
		what      string
		got, want int64
	}{
		{"attempts acquired", c.sum("pglocks.acquire.attempts", kindLease, result("acquired")), 3},
		{"attempts busy", c.sum("pglocks.acquire.attempts", kindLease, result("busy")), 1},
		{"attempts error", c.sum("pglocks.acquire.attempts", result("error")), 0},
		{"acquire durations", int64(c.count("pglocks.acquire.duration", kindLease)), 4},
		{"held now", c.sum("pglocks.held", kindLease), 1},
		{"losses not_held", c.sum("pglocks.losses", kindLease, reason("not_held")), 1},
		{"losses all", c.sum("pglocks.losses"), 1},
		{"holds ended released", int64(c.count("pglocks.hold.duration", reason("released"))), 1},
		{"holds ended not_held", int64(c.count("pglocks.hold.duration", reason("not_held"))), 1},
		{"renewals ok", int64(c.count("pglocks.renew.duration", result("ok"))), 1},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %d, want %d", ch.what, ch.got, ch.want)
		}
	}
	for name, d := range c {
		for _, kv := range attrsOf(d) {
			if kv.Key == otelpglocks.KeyName {
				t.Errorf("%s carries pglocks.name without WithNames", name)
			}
		}
	}
}

// attrsOf returns every attribute of every point of d.
func attrsOf(d metricdata.Aggregation) []attribute.KeyValue {
	var out []attribute.KeyValue
	switch d := d.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes.ToSlice()...)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes.ToSlice()...)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes.ToSlice()...)
		}
	}
	return out
}

// TestAdvisoryLoss checks the advisory side: a lock taken, a busy try (with
// names on, WithNames), and the loss of the lock when its session is
// killed.
func TestAdvisoryLoss(t *testing.T) {
	t.Parallel()
	obs, reader := meter(t, otelpglocks.WithNames())
	db := pgtest.New(t)
	pool := db.NewPool(t)
	ctx := ctxT(t)
	locker := newLocker(t, pool, advisory.Config{Observer: obs})
	other := newLocker(t, pool, advisory.Config{})
	key := pglocks.KeyOf("metrics-lock")
	lk, err := locker.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	held, err := other.TryLock(ctx, pglocks.KeyOf("busy"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)
	if _, err := locker.TryLock(ctx, pglocks.KeyOf("busy")); !errors.Is(err, advisory.ErrLocked) {
		t.Fatalf("TryLock of a held key = %v, want ErrLocked", err)
	}
	if got := collect(t, reader).sum("pglocks.held", kindAdvisory); got != 1 {
		t.Errorf("held while locked = %d, want 1", got)
	}
	if err := db.Server.TerminateBackend(ctx, lk.PID()); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, lk.Lost(), "the lock's loss")
	name := otelpglocks.KeyName.String(key.String())
	// The loss is reported from the Locker's own goroutine, not
	// necessarily before Lost closes (pglocks.Observer: not guaranteed).
	var c collected
	deadline := time.Now().Add(30 * time.Second)
	ended := func(c collected) bool {
		return c.sum("pglocks.held", kindAdvisory) == 0 && c.sum("pglocks.losses", kindAdvisory) == 1
	}
	for c = collect(t, reader); !ended(c) && time.Now().Before(deadline); c = collect(t, reader) {
		<-time.After(5 * time.Millisecond)
	}
	mode := otelpglocks.KeyMode.String("wait")
	if got := c.sum("pglocks.acquire.attempts", kindAdvisory, result("acquired"), mode, name); got != 1 {
		t.Errorf("acquired (wait, named) = %d, want 1", got)
	}
	if got := c.sum("pglocks.acquire.attempts", kindAdvisory, result("busy"), otelpglocks.KeyMode.String("try")); got != 1 {
		t.Errorf("busy tries = %d, want 1", got)
	}
	if got := c.sum("pglocks.losses", kindAdvisory, reason("session_died"), name); got != 1 {
		t.Errorf("losses session_died = %d, want 1", got)
	}
	if got := c.sum("pglocks.held", kindAdvisory); got != 0 {
		t.Errorf("held after the loss = %d, want 0", got)
	}
}

func newStore(t *testing.T, pool pgxPool, cfg lease.Config) *lease.Store {
	t.Helper()
	s, err := lease.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func newLocker(t *testing.T, pool pgxPool, cfg advisory.Config) *advisory.Locker {
	t.Helper()
	l, err := advisory.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not come within 30s", what)
	}
}

// TestLeaseExpiredReason: a lease that is not renewed before its trust
// deadline is counted as lost with reason expired.
func TestLeaseExpiredReason(t *testing.T) {
	t.Parallel()
	obs, reader := meter(t)
	db := pgtest.New(t)
	ctx := ctxT(t)
	store := newStore(t, db.NewPool(t), lease.Config{Observer: obs})
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := store.TryAcquire(ctx, "short", 300*time.Millisecond) // no keep-alive
	if err != nil {
		t.Fatal(err)
	}
	waitClosed(t, l.Lost(), "the unrenewed lease's loss")
	c := collect(t, reader)
	if got := c.sum("pglocks.losses", kindLease, reason("expired")); got != 1 {
		t.Errorf("losses expired = %d, want 1", got)
	}
	if got := c.sum("pglocks.held", kindLease); got != 0 {
		t.Errorf("held after the loss = %d, want 0", got)
	}
}
