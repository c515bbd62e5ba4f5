package otelpglocks

import (
	"errors"

	"go.opentelemetry.io/otel/metric"
)

// instruments are the metrics New makes.
type instruments struct {
	attempts   metric.Int64Counter
	acquireDur metric.Float64Histogram
	holdDur    metric.Float64Histogram
	held       metric.Int64UpDownCounter
	losses     metric.Int64Counter
	renewDur   metric.Float64Histogram
	status     metric.Int64Gauge
	terms      metric.Int64Counter
}

// Bucket boundaries in seconds: waits and renewals are short (ms to s),
// holds range from milliseconds to hours.
var (
	waitBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
	holdBuckets = []float64{0.01, 0.1, 1, 10, 60, 300, 900, 3600, 14400, 86400}
)

func newInstruments(m metric.Meter) (*instruments, error) {
	var ins instruments
	var errs [8]error
	ins.attempts, errs[0] = m.Int64Counter("pglocks.acquire.attempts", metric.WithUnit("{call}"),
		metric.WithDescription("Acquire calls of locks and leases, by result (acquired, busy, error)."))
	ins.acquireDur, errs[1] = m.Float64Histogram("pglocks.acquire.duration", metric.WithUnit("s"),
		metric.WithDescription("How long acquire calls took, waits included."), metric.WithExplicitBucketBoundaries(waitBuckets...))
	ins.holdDur, errs[2] = m.Float64Histogram("pglocks.hold.duration", metric.WithUnit("s"),
		metric.WithDescription("How long locks and leases were held, by how the hold ended."), metric.WithExplicitBucketBoundaries(holdBuckets...))
	ins.held, errs[3] = m.Int64UpDownCounter("pglocks.held", metric.WithUnit("{hold}"),
		metric.WithDescription("Locks and leases held now by this process."))
	ins.losses, errs[4] = m.Int64Counter("pglocks.losses", metric.WithUnit("{hold}"),
		metric.WithDescription("Locks and leases lost, by reason."))
	ins.renewDur, errs[5] = m.Float64Histogram("pglocks.renew.duration", metric.WithUnit("s"),
		metric.WithDescription("Latency of lease renewals, by result."), metric.WithExplicitBucketBoundaries(waitBuckets...))
	ins.status, errs[6] = m.Int64Gauge("pglocks.leader.status", metric.WithUnit("1"),
		metric.WithDescription("1 while this candidate leads the election, else 0."))
	ins.terms, errs[7] = m.Int64Counter("pglocks.leader.terms", metric.WithUnit("{term}"),
		metric.WithDescription("Terms this candidate started leading."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	return &ins, nil
}
