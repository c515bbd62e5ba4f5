package patronienv

import (
	"slices"
	"testing"
)

func TestFaults(t *testing.T) {
	faults := []string{"a", "b", "c"}
	t.Setenv("PGLOCKS_PATRONI_FAULTS", "")
	if got := Faults(faults...); !slices.Equal(got, faults) {
		t.Errorf("unset: %v", got)
	}
	t.Setenv("PGLOCKS_PATRONI_FAULTS", "c,a")
	if got := Faults(faults...); !slices.Equal(got, []string{"a", "c"}) || !slices.Equal(faults, []string{"a", "b", "c"}) {
		t.Errorf("c,a: %v (faults %v)", got, faults)
	}
}

func TestRuns(t *testing.T) {
	t.Setenv("PGLOCKS_PATRONI", "1")
	for env, want := range map[string]int{"": 2, "x": 2, "0": 2, "3": 3} {
		t.Setenv("PGLOCKS_PATRONI_RUNS", env)
		if got := Runs(t, 2); got != want {
			t.Errorf("PGLOCKS_PATRONI_RUNS=%q: %d, want %d", env, got, want)
		}
	}
}
