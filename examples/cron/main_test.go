package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestOneRunPerTick(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	attempts, err := run(ctx, pgtest.New(t).DSN, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(attempts) != ticks {
		t.Fatalf("%d ticks, want %d", len(attempts), ticks)
	}
	var lastToken int64
	for i, tick := range attempts {
		var runs []attempt
		for _, a := range tick {
			if a.Ran {
				runs = append(runs, a)
			}
		}
		if len(runs) != 1 {
			t.Errorf("tick %d: %d runs, want 1 (the others skip): %+v", i+1, len(runs), tick)
			continue
		}
		if r := runs[0]; r.Token <= lastToken {
			t.Errorf("tick %d: token %d, want above the previous run's %d", i+1, r.Token, lastToken)
		} else {
			lastToken = r.Token
		}
		// The job outlasted its TTL without losing the lease: renewed.
		if r := runs[0]; r.Took < 2*ttl {
			t.Errorf("tick %d: job took %v, want over two TTLs (%v)", i+1, r.Took, 2*ttl)
		}
	}
	if got, want := strings.Count(out.String(), ": skip,"), ticks*(replicas-1); got != want {
		t.Errorf("%d skips printed, want %d", got, want)
	}
}
