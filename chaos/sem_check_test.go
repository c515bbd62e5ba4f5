package chaos

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"
)

// permitCounts is the semaphores' counting oracle: at no instant are more
// than semLimit permits of one semaphore trusted, counting the trust
// windows of its slots (names "<sem>#<slot>") across every process and
// acquisition. It returns the most permits of each semaphore trusted at
// once, and a violation per instant where the limit was exceeded (the
// windows then open).
//
// The count is not in the porcupine model: expiry is not modelled (the
// model has no clock), so a permit abandoned by its holder may be taken
// again at any later point, and a model counting permits would have to
// allow any count. Windows have clocks.
func permitCounts(ws []trustWindow) (peak map[string]int, v []string) {
	peak = map[string]int{}
	bySem := map[string][]trustWindow{}
	for _, w := range ws {
		if sem := semSlotOf(w.name); sem != "" {
			bySem[sem] = append(bySem[sem], w)
		}
	}
	sems := make([]string, 0, len(bySem))
	for sem := range bySem {
		sems = append(sems, sem)
	}
	sort.Strings(sems)
	for _, sem := range sems {
		sw := bySem[sem]
		sort.Slice(sw, func(i, j int) bool { return sw[i].from < sw[j].from })
		var open []trustWindow
		for _, w := range sw {
			live := open[:0]
			for _, o := range open {
				if o.to > w.from {
					live = append(live, o)
				}
			}
			open = append(live, w)
			peak[sem] = max(peak[sem], len(open))
			if len(open) > semLimit && len(v) < 20 {
				v = append(v, fmt.Sprintf("%s: %d permits trusted at once (limit %d): %s", sem, len(open), semLimit, describeWindows(open, w.from)))
			}
		}
	}
	return peak, v
}

// describeWindows names the windows open at instant at.
func describeWindows(ws []trustWindow, at int64) string {
	parts := make([]string, len(ws))
	for i, w := range ws {
		parts[i] = fmt.Sprintf("%s tok=%d (p%d, trusted %v before, %v after)", w.name, w.tok, w.p,
			time.Duration(at-w.from), time.Duration(w.to-at))
	}
	return strings.Join(parts, "; ")
}

// TestPermitCountOracle: the counting oracle reports a fourth permit
// trusted while three are, on any slots, and not permits that follow one
// another or belong to another semaphore.
func TestPermitCountOracle(t *testing.T) {
	t.Parallel()
	w := func(name string, tok, from, to int64) trustWindow {
		return trustWindow{p: 1, name: name, tok: tok, from: from, to: to}
	}
	ok := []trustWindow{
		w("s#0", 1, 0, 10), w("s#1", 1, 0, 10), w("s#2", 1, 5, 20),
		w("s#0", 2, 10, 20), w("s#1", 2, 11, 30), // after their slots' previous permits
		w("as#0", 7, 0, 30), w("n1", 3, 0, 30), // another semaphore, a lease
	}
	peak, v := permitCounts(ok)
	if len(v) != 0 || peak["s"] != 3 || peak["as"] != 1 {
		t.Fatalf("no violation wanted, peaks s=3 as=1; got %v %v", peak, v)
	}
	bad := append(ok, w("s#1", 9, 15, 16)) // a second holder of slot 1, a fourth permit
	peak, v = permitCounts(bad)
	if len(v) != 1 || peak["s"] != 4 || !strings.Contains(v[0], "s: 4 permits trusted at once") {
		t.Fatalf("one violation wanted on s; got %v %v", peak, v)
	}
	sort.Slice(bad, func(i, j int) bool { return bad[i].from < bad[j].from })
	if len(overlaps(bad)) == 0 {
		t.Fatal("the per-slot oracle missed two holders of s#1")
	}
	if semSlotOf("s#limit") != "" || semSlotOf("#1") != "" || semSlotOf("a#b#12") != "a#b" {
		t.Fatal("semSlotOf")
	}
}
