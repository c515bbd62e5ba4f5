package main

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/pglocks/pglocks/examples/internal/exampledb"
	"github.com/pglocks/pglocks/examples/internal/exampletest"
	"github.com/pglocks/pglocks/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestOncePerSlot: replicas with clocks seconds apart tick on their own,
// with nothing between them; every slot between the first and the last is
// run exactly once — at least 20 of them — and every replica that did not
// run a slot was told which run had it.
func TestOncePerSlot(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	attempts, err := run(ctx, exampledb.Target{DSN: pgtest.New(t).DSN}, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string][]attempt{}
	var slots []string
	for _, a := range attempts {
		if _, ok := runs[a.Slot]; !ok {
			slots = append(slots, a.Slot)
		}
		runs[a.Slot] = append(runs[a.Slot], a)
	}
	slices.SortFunc(slots, byTime) // RFC 3339 keys drop trailing zeros: not in order as text
	if len(slots) < 22 {
		t.Fatalf("ticks reached %d slots, want at least 22", len(slots))
	}
	inner := slots[1 : len(slots)-1] // the first and last may have had only some replicas
	first, _ := time.Parse(time.RFC3339Nano, inner[0])
	last, _ := time.Parse(time.RFC3339Nano, inner[len(inner)-1])
	if n := int(last.Sub(first)/period) + 1; n != len(inner) {
		t.Errorf("%d slots from %s to %s, but %d had ticks: some were missed", n, inner[0], inner[len(inner)-1], len(inner))
	}
	for _, slot := range inner {
		var ran []attempt
		for _, a := range runs[slot] {
			if a.Ran {
				ran = append(ran, a)
			}
		}
		if len(ran) != 1 {
			t.Errorf("slot %s: %d runs, want 1: %+v", slot, len(ran), runs[slot])
			continue
		}
		for _, a := range runs[slot] {
			if a.Token != ran[0].Token {
				t.Errorf("slot %s: %s was told token %d, the run's is %d", slot, a.Replica, a.Token, ran[0].Token)
			}
		}
	}
	t.Logf("%d slots run once each, %d ticks of %d replicas", len(inner), len(attempts), len(skews))
}

// byTime orders slot keys, RFC 3339 times, by time.
func byTime(a, b string) int {
	ta, _ := time.Parse(time.RFC3339Nano, a)
	tb, _ := time.Parse(time.RFC3339Nano, b)
	return ta.Compare(tb)
}

// TestLeavesNothing: run with -dsn on a user's database, the example works
// in a schema of its own and drops it; the user's tables, rows and leases
// are as they were.
func TestLeavesNothing(t *testing.T) {
	t.Parallel()
	exampletest.LeavesNothing(t, run)
}
