package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"
)

// Fault kinds.
const (
	fTerminate  = "terminate"  // pg_terminate_backend of a random worker session
	fKill       = "kill"       // SIGKILL a worker; it is started again
	fStop       = "stop"       // SIGSTOP a worker, SIGCONT after Dur
	fLostReply  = "lostreply"  // a worker's proxy drops the server's replies for Dur
	fPartition  = "partition"  // a worker is cut off from the server, both ways, for Dur
	fRestart    = "restart"    // restart the server (every session dies)
	fCrash      = "crash"      // SIGKILL a server backend: the server crashes and recovers from its WAL
	fPromote    = "promote"    // stop the primary at once, promote the synchronous standby (runs on a cluster)
	fCutShort   = "cutshort"   // commits waiting for the standby cut short, then a promotion that loses them (a cluster)
	fTermHolder = "termholder" // pg_terminate_backend of a session holding an advisory lock (a permit's), else of any worker session
)

// fault is one entry of a schedule.
type fault struct {
	At     time.Duration // after the start of the run
	Kind   string
	Target int // worker slot, where the kind has one
	Dur    time.Duration
}

func (f fault) String() string {
	s := fmt.Sprintf("+%v %s", f.At.Round(time.Millisecond), f.Kind)
	if f.Kind != fRestart && f.Kind != fTerminate && f.Kind != fCrash && f.Kind != fPromote && f.Kind != fCutShort && f.Kind != fTermHolder {
		s += fmt.Sprintf(" w%d", f.Target)
	}
	if f.Dur > 0 {
		s += fmt.Sprintf(" for %v", f.Dur.Round(time.Millisecond))
	}
	return s
}

// schedule draws the faults of a run of length d from seed: one every
// 100–400 ms, kinds weighted so that the cheap ones are frequent and a
// server restart is rare. The same seed gives the same schedule.
func schedule(seed uint64, d time.Duration, workers int, kinds []string) []fault {
	weights := map[string]int{fTerminate: 4, fKill: 2, fStop: 2, fLostReply: 4, fPartition: 2, fRestart: 1, fCrash: 1, fPromote: 3, fCutShort: 2, fTermHolder: 4}
	var bag []string
	for _, k := range kinds {
		for range weights[k] {
			bag = append(bag, k)
		}
	}
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var out []fault
	for at := 500 * time.Millisecond; at < d && len(bag) > 0; at += time.Duration(100+r.IntN(300)) * time.Millisecond {
		f := fault{At: at, Kind: bag[r.IntN(len(bag))], Target: r.IntN(workers)}
		switch f.Kind {
		case fStop, fLostReply, fPartition:
			f.Dur = time.Duration(100+r.IntN(1400)) * time.Millisecond
		case fRestart, fCrash:
			at += time.Second // let the server come back before the next one
		case fPromote, fCutShort:
			at += 3 * time.Second // and the old primary rejoin as the standby
		}
		out = append(out, f)
	}
	return out
}

// injector carries out faults against the cluster of a run.
type injector interface {
	terminate(ctx context.Context, pick func(n int) int) error
	termHolder(ctx context.Context, pick func(n int) int) error
	kill(slot int) error
	stop(slot int, d time.Duration) error
	lostReply(slot int, d time.Duration) error
	partition(slot int, d time.Duration) error
	restart(ctx context.Context) error
	crash(ctx context.Context, pick func(n int) int) error
	promote(ctx context.Context) error
	cutShort(ctx context.Context) error
}

// play runs the schedule until ctx ends, and counts what it did.
func play(ctx context.Context, sched []fault, seed uint64, inj injector, logf func(string, ...any)) map[string]int {
	done := map[string]int{}
	start := time.Now()
	r := rand.New(rand.NewPCG(seed, 1))
	for _, f := range sched {
		t := time.NewTimer(time.Until(start.Add(f.At)))
		select {
		case <-ctx.Done():
			t.Stop()
			return done
		case <-t.C:
		}
		var err error
		switch f.Kind {
		case fTerminate:
			err = inj.terminate(ctx, func(n int) int { return r.IntN(n) })
		case fTermHolder:
			err = inj.termHolder(ctx, func(n int) int { return r.IntN(n) })
		case fKill:
			err = inj.kill(f.Target)
		case fStop:
			err = inj.stop(f.Target, f.Dur)
		case fLostReply:
			err = inj.lostReply(f.Target, f.Dur)
		case fPartition:
			err = inj.partition(f.Target, f.Dur)
		case fRestart:
			err = inj.restart(ctx)
		case fCrash:
			err = inj.crash(ctx, func(n int) int { return r.IntN(n) })
		case fPromote:
			err = inj.promote(ctx)
		case fCutShort:
			err = inj.cutShort(ctx)
		}
		if err != nil {
			logf("fault %v: %v", f, err)
			continue
		}
		done[f.Kind]++
	}
	<-ctx.Done()
	return done
}

// table prints counts as "k=v" pairs in key order.
func table[V any](m map[string]V) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%v", k, m[k])
	}
	return strings.Join(parts, " ")
}
