package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/pglocks/pglocks/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	sum, err := run(ctx, pgtest.New(t).DSN, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	want := summary{Processed: 1, Duplicates: deliveries - 2, Refused: 1, Credits: 1}
	if sum != want {
		t.Errorf("got %+v, want %+v", sum, want)
	}
}

// TestRerun runs the example twice on one database, as with DATABASE_URL:
// each run has its own payment and processes it once.
func TestRerun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	dsn := pgtest.New(t).DSN
	for range 2 {
		var out bytes.Buffer
		sum, err := run(ctx, dsn, &out)
		if err != nil {
			t.Fatal(err)
		}
		if sum.Processed != 1 || sum.Credits != 1 {
			t.Errorf("got %+v, want one processed delivery and one credit", sum)
		}
	}
}
