package chaos

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// failover is one Patroni fault of a run. Times are from the fault's
// injection, At, on CLOCK_MONOTONIC like the history's.
type failover struct {
	Kind     string
	Old, New string
	At       int64
	// Writable: until the new primary accepted a write (pgtest's poller;
	// Patroni's part). Resumed: until the workers' operations were
	// acknowledged again, at the end of the longest gap between
	// acknowledgements from At to 5 s after Writable (-1: none then).
	// Recovered: until a synchronous standby was back (-1: not waited
	// for, see TestPatroniChaosPause).
	Writable, Resumed, Recovered time.Duration
}

// failovers returns the run's failovers with the time the workers took to
// have operations acknowledged again, read from the history evs.
func (pr *patroniRun) failovers(evs []event) []failover {
	var acks []int64
	for _, e := range evs {
		if e.K == evRet && e.Res == resOK {
			acks = append(acks, e.T)
		}
	}
	slices.Sort(acks)
	pr.mu.Lock()
	defer pr.mu.Unlock()
	out := slices.Clone(pr.done) // in the order injected
	for i, f := range out {
		until := f.At + int64(f.Writable+5*time.Second)
		if i+1 < len(out) {
			until = min(until, out[i+1].At)
		}
		out[i].Resumed = resumed(acks, f.At, until)
	}
	return out
}

// resumed returns, from at, the end of the longest gap between the
// acknowledgements acks (sorted) in [at, until], at counting as one: the
// outage the fault caused. -1 if none came after at.
func resumed(acks []int64, at, until int64) time.Duration {
	prev, best, end := at, int64(-1), int64(-1)
	for _, a := range acks[sortedFrom(acks, at):] {
		if a > until {
			break
		}
		if a-prev > best {
			best, end = a-prev, a
		}
		prev = a
	}
	if end < 0 {
		return -1
	}
	return time.Duration(end - at)
}

// sortedFrom is the index of the first of acks (sorted) at or after at.
func sortedFrom(acks []int64, at int64) int {
	i, _ := slices.BinarySearch(acks, at)
	return i
}

func (f failover) String() string {
	res := "never (within 5 s of writable)"
	if f.Resumed >= 0 {
		res = fmt.Sprintf("%v (%+v after writable)", ms(f.Resumed), ms(f.Resumed-f.Writable))
	}
	return fmt.Sprintf("%s %s→%s: writable %v, operations acknowledged again %s, %s",
		f.Kind, f.Old, f.New, ms(f.Writable), res, f.recovery())
}

// recovery says when a synchronous standby was back.
func (f failover) recovery() string {
	if f.Recovered < 0 {
		return "not recovered"
	}
	return "synchronous standby " + ms(f.Recovered).String()
}

func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// failoverSummary gives, per fault kind, p50 and max of the times of fs.
func failoverSummary(fs []failover) string {
	by := map[string][]failover{}
	for _, f := range fs {
		by[f.Kind] = append(by[f.Kind], f)
	}
	var b strings.Builder
	b.WriteString("fault: n, writable p50/max, operations acknowledged again p50/max (after writable p50/max), synchronous standby p50/max\n")
	for _, k := range slices.Sorted(maps.Keys(by)) {
		var w, r, o, s []time.Duration
		never := 0
		for _, f := range by[k] {
			w = append(w, f.Writable)
			if f.Recovered >= 0 {
				s = append(s, f.Recovered)
			}
			if f.Resumed < 0 {
				never++
				continue
			}
			r, o = append(r, f.Resumed), append(o, f.Resumed-f.Writable)
		}
		fmt.Fprintf(&b, "  %s: %d, %s, %s (%s; never %d), %s\n", k, len(by[k]), p50max(w), p50max(r), p50max(o), never, p50max(s))
	}
	return b.String()
}

// p50max prints the median and the maximum of ds.
func p50max(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	slices.Sort(ds)
	return fmt.Sprintf("%v/%v", ms(ds[(len(ds)-1)/2]), ms(ds[len(ds)-1]))
}
