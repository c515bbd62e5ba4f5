// Package otelpglocks reports the events of pglocks' advisory, lease and
// leader packages as OpenTelemetry metrics. It is the only pglocks package
// that imports OpenTelemetry: the core packages report through the
// dependency-free [pglocks.Observer] hook, which [New] fills in.
//
//	obs, err := otelpglocks.New(otelpglocks.WithMeterProvider(mp))
//	locker, err := advisory.New(pool, advisory.Config{Observer: obs})
//	store, err := lease.New(pool, lease.Config{Observer: obs})
//	elector, err := leader.New(leader.Config{Name: "jobs", Pool: pool, Observer: obs})
//
// The instruments (meter "github.com/pglocks/pglocks/otelpglocks"):
//
//	pglocks.acquire.attempts  counter     acquire calls, by pglocks.kind, pglocks.mode (try|wait), pglocks.result (acquired|busy|error)
//	pglocks.acquire.duration  histogram s how long acquire calls took (the wait), same attributes
//	pglocks.hold.duration     histogram s how long holds lasted, by pglocks.kind, pglocks.reason
//	pglocks.held              updown      holds now, by pglocks.kind
//	pglocks.losses            counter     holds lost, by pglocks.kind, pglocks.reason (session_died|expired|not_held|unknown_outcome)
//	pglocks.renew.duration    histogram s lease renewals' latency, by pglocks.kind, pglocks.result (ok|error)
//	pglocks.leader.status     gauge       1 while this candidate leads, else 0, by pglocks.election
//	pglocks.leader.terms      counter     terms this candidate started, by pglocks.election
//
// Attributes are low-cardinality by default: the kind of primitive, the
// result or reason, and for elections the election's name (one per
// election, chosen in code). Lock keys and lease names are added as
// pglocks.name only with [WithNames], since an application may derive them
// from request data.
package otelpglocks

import (
	"context"

	"github.com/pglocks/pglocks"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope (meter name) of the instruments.
const ScopeName = "github.com/pglocks/pglocks/otelpglocks"

// Attribute keys of the instruments.
const (
	KeyKind     = attribute.Key("pglocks.kind")
	KeyMode     = attribute.Key("pglocks.mode")
	KeyResult   = attribute.Key("pglocks.result")
	KeyReason   = attribute.Key("pglocks.reason")
	KeyName     = attribute.Key("pglocks.name")
	KeyElection = attribute.Key("pglocks.election")
)

type config struct {
	mp    metric.MeterProvider
	names bool
	attrs []attribute.KeyValue
}

// Option configures [New].
type Option func(*config)

// WithMeterProvider sets the MeterProvider the instruments are made with.
// Default: otel.GetMeterProvider(), the global one.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithNames adds the lock key or lease name as attribute pglocks.name to
// every acquire, hold and renew measurement. Use it only when the names
// are few: each distinct name makes a new time series.
func WithNames() Option { return func(c *config) { c.names = true } }

// WithAttributes adds attrs to every measurement, for instance the name of
// the service's component.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return func(c *config) { c.attrs = append(c.attrs, attrs...) }
}

// New makes the instruments and returns an Observer that records into
// them; set it as the Observer of advisory, lease and leader Configs (one
// Observer may serve them all). It fails only if the MeterProvider refuses
// an instrument.
func New(opts ...Option) (*pglocks.Observer, error) {
	c := config{}
	for _, o := range opts {
		if o != nil { // a nil Option does nothing
			o(&c)
		}
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	ins, err := newInstruments(c.mp.Meter(ScopeName))
	if err != nil {
		return nil, err
	}
	r := &recorder{ins: ins, cfg: c}
	return &pglocks.Observer{Acquire: r.acquire, Start: r.start, End: r.end, Renew: r.renew, Leader: r.leader}, nil
}

// recorder turns events into measurements.
type recorder struct {
	ins *instruments
	cfg config
}

// set returns the attribute set of a measurement about name.
func (r *recorder) set(name string, kvs ...attribute.KeyValue) metric.MeasurementOption {
	kvs = append(kvs, r.cfg.attrs...)
	if r.cfg.names && name != "" {
		kvs = append(kvs, KeyName.String(name))
	}
	return metric.WithAttributes(kvs...)
}

func (r *recorder) acquire(e pglocks.AcquireEvent) {
	mode := "try"
	if e.Wait {
		mode = "wait"
	}
	opt := r.set(e.Name, KeyKind.String(string(e.Kind)), KeyMode.String(mode), KeyResult.String(string(e.Result)))
	ctx := context.Background()
	r.ins.attempts.Add(ctx, 1, opt)
	r.ins.acquireDur.Record(ctx, e.Elapsed.Seconds(), opt)
}

func (r *recorder) start(e pglocks.HoldEvent) {
	r.ins.held.Add(context.Background(), 1, r.set(e.Name, KeyKind.String(string(e.Kind))))
}

func (r *recorder) end(e pglocks.EndEvent) {
	ctx := context.Background()
	kind := KeyKind.String(string(e.Kind))
	opt := r.set(e.Name, kind, KeyReason.String(string(e.Reason)))
	r.ins.holdDur.Record(ctx, e.Held.Seconds(), opt)
	if e.Reason.Lost() {
		r.ins.losses.Add(ctx, 1, opt)
	}
	// The hold leaves the gauge last: a reader that sees it gone also sees
	// how it ended.
	r.ins.held.Add(ctx, -1, r.set(e.Name, kind))
}

func (r *recorder) renew(e pglocks.RenewEvent) {
	res := "ok"
	if e.Err != nil {
		res = "error"
	}
	r.ins.renewDur.Record(context.Background(), e.Latency.Seconds(),
		r.set(e.Name, KeyKind.String(string(e.Kind)), KeyResult.String(res)))
}

func (r *recorder) leader(e pglocks.LeaderEvent) {
	ctx := context.Background()
	opt := r.set("", KeyElection.String(e.Election))
	if e.Leading {
		r.ins.status.Record(ctx, 1, opt)
		r.ins.terms.Add(ctx, 1, opt)
		return
	}
	r.ins.status.Record(ctx, 0, opt)
}
