package main

import (
	"fmt"
	"strconv"
	"strings"
)

var (
	goroutines = []string{"G8", "G32", "G64"}
	clients    = []string{"clients=8", "clients=16", "clients=32", "clients=64"}
	waiters    = []string{"waiters=8", "waiters=32", "waiters=64"}
)

// rows is the performance table of docs/performance.md: the operation, then the figures of
// this run.
func (t *table) rows() string {
	var b strings.Builder
	row := func(op, format string, args ...any) {
		fmt.Fprintf(&b, "| %s | %s |\n", op, fmt.Sprintf(format, args...))
	}
	b.WriteString("| operation | result |\n|---|---|\n")
	const as, at, al = "advisory-single", "advisory-throughput", "advisory-fanout"
	row("advisory `TryLock` + `Unlock` (two round trips)",
		"%s× `SELECT 1`; raw `pg_try_advisory_lock` + `pg_advisory_unlock`: %s×",
		t.medSpan(as, "VsFloor", "ours/select1"), t.medSpan(as, "VsFloor", "raw/select1"))
	for _, kind := range []string{"Hot", "Distinct"} {
		what := map[string]string{"Hot": "one hot key", "Distinct": "distinct keys"}[kind]
		row("advisory `Lock` + `Unlock` acquisitions/s, "+what+", 8 / 32 / 64 goroutines", "%s",
			each(goroutines, func(g string) string { return k(t.med(at, "Throughput/"+kind+"/"+g, "acq/s")) }))
	}
	row("advisory `TryLock` + `Unlock` pairs/s, distinct keys, 8 / 32 / 64 goroutines, ours/raw (`BenchmarkTryThroughput`)",
		"%s (%s against raw's %s, one connection per goroutine); a Locker's 3 sessions pipeline their queued statements; 8 sessions: %s",
		each(goroutines, func(g string) string {
			return t.ratioSpan(at, "TryThroughput/Try/"+g, "TryThroughput/Raw/"+g, "pairs/s")
		}),
		each(goroutines, func(g string) string { return k(t.med(at, "TryThroughput/Try/"+g, "pairs/s")) }),
		each(goroutines, func(g string) string { return k(t.med(at, "TryThroughput/Raw/"+g, "pairs/s")) }),
		each(goroutines, func(g string) string { return k(t.med(at, "TryThroughput/Try8/"+g, "pairs/s")) }))
	row("advisory wake-up, `Unlock` → waiter in another locker holds it", "%s ms (mean)",
		f2(t.med(as, "WakeUp", "µs-wake/op")/1000))
	row("NOTIFY fan-out: 50 Lockers, 1,000 waited-on keys (`BenchmarkFanout`)",
		"every listener gets every event: %s µs of client CPU per delivery; the listeners' server backends use %s× the CPU of the lock sessions' backends; %s events per unlock in the hand-over",
		strconv.FormatFloat(t.med(al, "Fanout", "client-ns/delivery")/1000, 'f', 1, 64),
		f2(t.med(al, "Fanout", "listener/session-cpu")),
		strconv.FormatFloat(t.med(al, "Fanout", "events/unlock"), 'f', 1, 64))
	row("10,000 advisory locks held at once", "%.0f server connections, %.0f B of Go heap per lock",
		t.med(as, "HeldLocks", "conns"), t.med(as, "HeldLocks", "heapB/lock"))
	t.leaseRows(row)
	row("`KeyOf`", "%.0f ns, no round trip", t.med("keys", "KeyOf", "ns/op"))
	return b.String()
}

func (t *table) leaseRows(row func(op, format string, args ...any)) {
	const ls, lt, lh, lk = "lease-single", "lease-throughput", "lease-hot", "lease-keepalive"
	row("lease `TryAcquire` + `Release` (one statement each; a store retakes a name it released with a plain UPDATE of the released row; the release does not wait for its WAL flush)",
		"%s× the raw two-statement SQL pair, %s× that pair with the same lazy release (%s× `SELECT 1`; raw pair %.0f µs, lazy %.0f µs, ours %.0f µs)",
		t.medSpan(ls, "VsFloor", "ours/rawpair"), t.medSpan(ls, "VsFloor", "ours/rawlazy"), t.medSpan(ls, "VsFloor", "ours/select1"),
		t.med(ls, "VsFloor", "rawpair-ns")/1000, t.med(ls, "VsFloor", "rawlazy-ns")/1000, t.med(ls, "VsFloor", "acquire+release-ns")/1000)
	row("lease failed try (no row lock, no WAL)", "%.0f µs, vs %.0f µs for the naive `INSERT … ON CONFLICT DO UPDATE … WHERE`",
		t.med(ls, "FailedTry/TryAcquire", "ns/op")/1000, t.med(ls, "FailedTry/NaiveUpsert", "ns/op")/1000)
	per := func(name string) func(string) string {
		return func(c string) string { return k(t.med(lt, "Throughput/"+name+"/"+c, "pairs/s")) }
	}
	vs := func(name string) func(string) string {
		return func(c string) string {
			return t.ratioSpan(lt, "Throughput/Distinct/"+c, "Throughput/"+name+"/"+c, "pairs/s")
		}
	}
	row("lease `TryAcquire` + `Release` pairs/s, distinct names, 8 / 16 / 32 / 64 clients (a store batches its calls when eight of a kind are in flight)",
		"%s; raw pair %s, ours/raw per run, median (range) %s; raw pair with a lazy release %s, ours/that %s",
		each(clients, per("Distinct")), each(clients, per("RawDistinct")), each(clients, vs("RawDistinct")),
		each(clients, per("RawDistinctLazy")), each(clients, vs("RawDistinctLazy")))
	t.fsyncRow(row)
	hot8 := t.med(lh, "HotAcquire/waiters=8", "ours-acq/s")
	row("lease hot name, blocking `Acquire` + `Release`, acquisitions/s at 8 / 32 / 64 waiters (one store; FIFO queue, a release wakes one)",
		"%s (64 waiters: %s× 8), vs the raw retry-at-once SQL loop %s in the same iterations (ours/raw %s)",
		each(waiters, func(w string) string { return k(t.med(lh, "HotAcquire/"+w, "ours-acq/s")) }),
		f2(t.med(lh, "HotAcquire/waiters=64", "ours-acq/s")/max(hot8, 1)),
		each(waiters, func(w string) string { return k(t.med(lh, "HotAcquire/"+w, "raw-acq/s")) }),
		each(waiters, func(w string) string { return strconv.FormatFloat(t.med(lh, "HotAcquire/"+w, "ours/raw"), 'f', 1, 64) }))
	row("10,000 kept-alive leases (TTL 30 s), one store", "%s statements/s, %s renewal commits (WAL flushes)/s — one batch per interval",
		f2(t.med(lk, "KeepAlive10k", "stmts/s")), f2(t.med(lk, "KeepAlive10k", "renewals/s")))
	row("lease wake-up, `Release` → waiter holds it", "p50 %s ms, p99 %s ms",
		f2(t.med(ls, "Wakeup", "p50-µs")/1000), f2(t.med(ls, "Wakeup", "p99-µs")/1000))
}

// fsyncRow is the lease pair again on a server with fsync on.
func (t *table) fsyncRow(row func(op, format string, args ...any)) {
	const lf = "lease-fsync"
	row("the same on a server with fsync on (full_page_writes still off; pgtest's servers run with fsync off): pair; pairs/s at 8 / 16 / 32 / 64 clients",
		"pair %s× the raw pair, %s× the lazy raw pair (raw %.0f µs, ours %.0f µs); pairs/s %s, raw %s, ours/raw %s, lazy raw %s, ours/that %s",
		t.medSpan(lf, "VsFloor", "ours/rawpair"), t.medSpan(lf, "VsFloor", "ours/rawlazy"),
		t.med(lf, "VsFloor", "rawpair-ns")/1000, t.med(lf, "VsFloor", "acquire+release-ns")/1000,
		each(clients, func(c string) string { return k(t.med(lf, "Throughput/Distinct/"+c, "pairs/s")) }),
		each(clients, func(c string) string { return k(t.med(lf, "Throughput/RawDistinct/"+c, "pairs/s")) }),
		each(clients, func(c string) string {
			return t.ratioSpan(lf, "Throughput/Distinct/"+c, "Throughput/RawDistinct/"+c, "pairs/s")
		}),
		each(clients, func(c string) string { return k(t.med(lf, "Throughput/RawDistinctLazy/"+c, "pairs/s")) }),
		each(clients, func(c string) string {
			return t.ratioSpan(lf, "Throughput/Distinct/"+c, "Throughput/RawDistinctLazy/"+c, "pairs/s")
		}))
}
