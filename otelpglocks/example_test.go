package otelpglocks_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/otelpglocks"
	"github.com/pglocks/pglocks/pgtest"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// A Locker reports to OpenTelemetry through the Observer New returns.
func Example() {
	ctx := context.Background()
	dsn, err := pgtest.ExampleDSN(ctx) // a throwaway database; use your own
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	reader := sdkmetric.NewManualReader() // in a service: a periodic exporter
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)
	obs, err := otelpglocks.New(otelpglocks.WithMeterProvider(mp))
	if err != nil {
		log.Fatal(err)
	}
	locker, err := advisory.New(pool, advisory.Config{Observer: obs})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(ctx)

	lk, err := locker.TryLock(ctx, pglocks.KeyOf("report"))
	if err != nil {
		log.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	_ = reader.Collect(ctx, &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "pglocks.held" {
			fmt.Println(m.Name, s.DataPoints[0].Value)
		}
	}
	_ = lk.Unlock(ctx)
	// Output: pglocks.held 1
}
