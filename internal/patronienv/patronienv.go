// Package patronienv reads the settings of the project's opt-in Patroni
// tests from the environment: PGLOCKS_PATRONI=1 runs them,
// PGLOCKS_PATRONI_RUNS sets how many faults of each kind they inject, and
// PGLOCKS_PATRONI_FAULTS (a comma-separated list, e.g. "partition" or
// "switchover,kill-node") picks the faults. It is for tests only.
package patronienv

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Runs skips t unless PGLOCKS_PATRONI=1, and returns PGLOCKS_PATRONI_RUNS,
// or def if that is unset or not a positive number.
func Runs(t testing.TB, def int) int {
	t.Helper()
	if os.Getenv("PGLOCKS_PATRONI") != "1" {
		t.Skip("Patroni tests are opt-in: set PGLOCKS_PATRONI=1")
	}
	if n, err := strconv.Atoi(os.Getenv("PGLOCKS_PATRONI_RUNS")); err == nil && n > 0 {
		return n
	}
	return def
}

// Faults returns faults, or those of them PGLOCKS_PATRONI_FAULTS names, in
// a new slice.
func Faults[F ~string](faults ...F) []F {
	want := os.Getenv("PGLOCKS_PATRONI_FAULTS")
	if want == "" {
		return slices.Clone(faults)
	}
	names := strings.Split(want, ",")
	return slices.DeleteFunc(slices.Clone(faults), func(f F) bool { return !slices.Contains(names, string(f)) })
}
