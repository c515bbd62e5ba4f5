package chaos

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// linIn and linOut are a fenced-lock operation's input and output.
type linIn struct {
	Op   string
	Name string
	Tok  int64 // release and write: the token used
	Val  int64 // write: the value written
}

type linOut struct {
	Res string
	Tok int64 // acquire ok: the token received
	Val int64 // read: the value read
}

// lockState is the model's state of one name: the newest token handed out,
// whether its acquisition may still be the holder, and the protected value.
// Expiry is not modelled (the model has no clock), so it only ever allows
// more: after an unseen expiry, a newer acquisition makes the old token
// stale, which is what the model checks.
type lockState struct {
	Cur   int64
	Valid bool
	Val   int64
}

// step is the fenced lock: tokens only grow; a write is accepted only with
// the newest token while its acquisition may still hold; a read returns
// the last accepted write. Unknown outcomes may or may not have happened.
func step(state, input, output any) []any {
	s, in, out := state.(lockState), input.(linIn), output.(linOut)
	holder := s.Valid && in.Tok == s.Cur
	switch in.Op {
	case opAcquire:
		switch out.Res {
		case resOK:
			if out.Tok > s.Cur {
				return []any{lockState{Cur: out.Tok, Valid: true, Val: s.Val}}
			}
			return nil
		case resBusy:
			return []any{s}
		}
		// Unknown: perhaps an acquisition nobody heard of now holds it.
		return []any{s, lockState{Cur: s.Cur, Valid: false, Val: s.Val}}
	case opRelease:
		released := lockState{Cur: s.Cur, Valid: false, Val: s.Val}
		switch out.Res {
		case resOK:
			if holder {
				return []any{released}
			}
			return nil
		case resUnknown:
			if holder {
				return []any{s, released}
			}
		}
		return []any{s}
	case opWrite:
		written := lockState{Cur: s.Cur, Valid: s.Valid, Val: in.Val}
		switch out.Res {
		case resOK:
			if holder {
				return []any{written}
			}
			return nil
		case resUnknown:
			if holder {
				return []any{s, written}
			}
		}
		return []any{s}
	case opRead:
		if out.Res == resOK && out.Val != s.Val {
			return nil
		}
		return []any{s}
	}
	return nil
}

// constrains reports whether an operation can change what the model
// allows, so that porcupine must place it. Those that cannot are left out
// of the check, which decides the same without them: a busy acquire, a
// refused or not-held operation, a read with no result leave the state
// as it is; an unknown acquire or release leaves it as it is or makes the
// acquisition no longer the holder — a state that allows a subset of
// what the unchanged one allows (Valid false only refuses more; Cur and
// Val are the same), so that branch never helps. Leaving them out
// matters: with many clients, each unknown or never-returned operation
// multiplies the orders porcupine tries.
func constrains(in linIn, out linOut) bool {
	switch in.Op {
	case opAcquire, opRelease, opRead:
		return out.Res == resOK
	case opWrite:
		return out.Res == resOK || out.Res == resUnknown
	}
	return true
}

var fencedLock = (&porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var names []string
		for _, op := range h {
			n := op.Input.(linIn).Name
			if _, ok := by[n]; !ok {
				names = append(names, n)
			}
			by[n] = append(by[n], op)
		}
		sort.Strings(names)
		out := make([][]porcupine.Operation, 0, len(names))
		for _, n := range names {
			out = append(out, by[n])
		}
		return out
	},
	Init: func() []any { return []any{lockState{}} },
	Step: step,
	DescribeOperation: func(in, out any) string {
		i, o := in.(linIn), out.(linOut)
		return fmt.Sprintf("%s(%s tok=%d val=%d) -> %s tok=%d val=%d", i.Op, i.Name, i.Tok, i.Val, o.Res, o.Tok, o.Val)
	},
}).ToModel()

// operations pairs calls with returns. A call without a return (its process
// was killed) is pending: its outcome is unknown and it may take effect at
// any time after its call.
func operations(evs []event) []porcupine.Operation {
	type key struct {
		p int
		i int64
	}
	calls := map[key]event{}
	var order []key
	rets := map[key]event{}
	for _, e := range evs {
		k := key{e.P, e.I}
		switch e.K {
		case evCall:
			calls[k] = e
			order = append(order, k)
		case evRet:
			rets[k] = e
		}
	}
	ops := make([]porcupine.Operation, 0, len(order))
	for _, k := range order {
		c := calls[k]
		in := linIn{Op: c.Op, Name: c.Name, Tok: c.Tok, Val: c.Val}
		op := porcupine.Operation{ClientId: k.p, Input: in, Call: c.T,
			Output: linOut{Res: resUnknown}, Return: math.MaxInt64}
		if r, ok := rets[k]; ok {
			op.Output = linOut{Res: r.Res, Tok: r.Tok, Val: r.Val}
			op.Return = r.T
		}
		ops = append(ops, op)
	}
	return ops
}

// checkLinearizable runs porcupine over the history, one partition per
// name. It returns a description of the first violation, or "".
func checkLinearizable(ops []porcupine.Operation, timeout time.Duration) (string, porcupine.CheckResult) {
	res, info := porcupine.CheckOperationsVerbose(fencedLock, ops, timeout)
	if res != porcupine.Illegal {
		return "", res
	}
	return describeIllegal(info, ops), res
}

// describeIllegal prints, for each name whose history is not
// linearizable, the end of the longest linearizable prefix found and the
// operations that could not be placed after it (the earliest called).
func describeIllegal(info porcupine.LinearizationInfo, ops []porcupine.Operation) string {
	parts := fencedLock.Partition(ops)
	s := "not linearizable:\n"
	for pi, part := range info.PartialLinearizationsOperations() {
		if pi >= len(parts) || len(part) == 0 || len(part[0]) >= len(parts[pi]) {
			continue // this name's history is linearizable
		}
		lin := slices.MaxFunc(part, func(a, b []porcupine.Operation) int { return len(a) - len(b) })
		placed := map[[2]int64]bool{}
		for _, op := range lin {
			placed[[2]int64{int64(op.ClientId), op.Call}] = true
		}
		s += fmt.Sprintf("  %s: %d of %d operations placed; the last of them:\n", parts[pi][0].Input.(linIn).Name, len(lin), len(parts[pi]))
		for _, op := range lin[max(0, len(lin)-8):] {
			s += "    " + describeOp(op) + "\n"
		}
		s += "  none of these fits next:\n"
		rest := 0
		sorted := slices.Clone(parts[pi])
		sort.Slice(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
		for _, op := range sorted {
			if !placed[[2]int64{int64(op.ClientId), op.Call}] && rest < 4 {
				s += "    " + describeOp(op) + "\n"
				rest++
			}
		}
	}
	return s
}

func describeOp(op porcupine.Operation) string {
	ret := "never returned"
	if op.Return != math.MaxInt64 {
		ret = fmt.Sprintf("returned %.3fs", float64(op.Return)/1e9)
	}
	return fmt.Sprintf("p%d %s  (called %.3fs, %s)", op.ClientId, fencedLock.DescribeOperation(op.Input, op.Output), float64(op.Call)/1e9, ret)
}

// trustWindow is what one acquisition's holder reported: over [from, to]
// it checked, and found, that it held the lease.
type trustWindow struct {
	p        int
	name     string
	tok      int64
	shared   bool // an advisory shared lock: shared windows may overlap
	from, to int64
}

// trustWindows merges the holders' checks into one window per acquisition.
// A check is a pair (before, after) around one reading; the holder was
// sure of the lease at some instant in between, so the window from the
// first check's "after" to the last check's "before" lies inside the time
// it really trusted (it may be empty). A lease acquisition holds from the
// moment Acquire returned it: its window starts there at the latest.
func trustWindows(evs []event) []trustWindow {
	type key struct {
		name string
		tok  int64
	}
	granted := map[key]int64{}
	for _, op := range operations(evs) {
		in, out := op.Input.(linIn), op.Output.(linOut)
		if in.Op == opAcquire && out.Res == resOK {
			granted[key{in.Name, out.Tok}] = op.Return
		}
	}
	m := map[key]*trustWindow{}
	for _, e := range evs {
		if e.K != evTrust {
			continue
		}
		k := key{e.Name, e.Tok}
		w := m[k]
		if w == nil {
			w = &trustWindow{p: e.P, name: e.Name, tok: e.Tok, shared: e.Val == 1, from: e.To, to: e.T}
			m[k] = w
		}
		w.from = min(w.from, e.To)
		w.to = max(w.to, e.T)
	}
	for k, w := range m {
		if at, ok := granted[k]; ok {
			w.from = min(w.from, at)
		}
	}
	var out []trustWindow
	for _, w := range m {
		if w.from < w.to {
			out = append(out, *w)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].from < out[j].from })
	return out
}

// overlaps returns every pair of acquisitions of one name trusted at
// overlapping instants.
func overlaps(ws []trustWindow) []string {
	var v []string
	for i := range ws {
		for j := i + 1; j < len(ws) && ws[j].from < ws[i].to; j++ {
			if ws[i].name == ws[j].name && !(ws[i].shared && ws[j].shared) {
				v = append(v, fmt.Sprintf("%s: token %d (p%d) and token %d (p%d) both trusted for %v",
					ws[i].name, ws[i].tok, ws[i].p, ws[j].tok, ws[j].p,
					time.Duration(min(ws[i].to, ws[j].to)-ws[j].from)))
			}
		}
	}
	return v
}
