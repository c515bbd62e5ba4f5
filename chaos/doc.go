// Package chaos is pglocks' history-checked fault suite. It has no API: its
// tests are the product. Run it with
//
//	go test ./chaos/                       # default: a short run per workload
//	CHAOS_OPS=20000 go test -timeout 30m ./chaos/
//	CHAOS_SEED=1234 go test ./chaos/       # replay one schedule of faults
//
// Each workload runs in three or more OS processes (re-executions of the
// test binary) against one PostgreSQL server, each process through a proxy
// of its own so that faults can single it out. Every operation a worker
// makes is recorded twice — when it is called and when it returns — with
// the machine's one monotonic clock (CLOCK_MONOTONIC), so that the
// histories of all processes can be merged. An operation whose process was
// killed before it returned stays pending: its outcome is unknown, which is
// how the checker treats it, never dropped.
//
// Faults are drawn from a seed (printed; CHAOS_SEED replays the same
// schedule of faults, though not the same interleaving of operations):
// lost replies (the proxy forwards requests and drops the server's answers),
// pg_terminate_backend of random worker sessions, SIGKILL of a worker
// (restarted), SIGSTOP … SIGCONT of a worker, a real partition of a worker
// from the server (pgtest's partitionable proxy: packets dropped both ways,
// local servers only), a restart of the server (fast
// shutdown), and a server crash (a backend SIGKILLed: the postmaster ends
// every session and recovers from the WAL on disk, losing what was
// committed asynchronously; local servers only). CHAOS_FAULTS=kind,kind
// limits a run to some kinds. TestLeasePromoteChaos runs the lease
// workload on a primary with a synchronous standby (pgtest.NewCluster), the
// workers connected through its multi-host DSN, with two more faults:
// promotions (the primary stopped at once, the standby promoted, the old
// primary rejoined as the new standby) and cut-short commits (replication
// paused so that every commit waits for the standby, the waiting worker
// sessions terminated — their commits stay on the primary alone, visible
// to every session — then a promotion that loses them). A plain read can
// see such a commit before the promotion takes it back, so the promotion
// runs read the protected value FOR SHARE, whose commit waits for the
// standby like a write's. TestCheckerReportsCutShortRead checks a
// history recorded with plain reads (opt-in TestCutShortPlainReads,
// CHAOS_PLAIN_READS=1), in which a read saw a value that the promotion
// then lost, and asserts that the checker reports it. CHAOS_DUMP=dir
// saves each run's history in dir/<test name>; CHAOS_CHECK=dir/<test name>
// re-checks one (TestCheckDump; the history oracles, not the final
// counter and leftover checks, which need the run's server).
//
// The oracles:
//
//   - linearizability of each name's history, checked with porcupine against
//     a model of a fenced lock: acquire → ok(token) / busy / unknown,
//     release, guarded write(token) → accepted / refused / unknown, read;
//   - a counter incremented only inside guarded transactions ends between
//     the number of acknowledged increments and that number plus the
//     increments whose outcome is unknown;
//   - no two acquisitions of a name are trusted at overlapping instants:
//     each holder reports the interval over which it checked, and found,
//     that it still held its lease (live Context, trust deadline ahead),
//     which starts at the latest when Acquire returned the lease;
//   - after the run: no row held, no worker session left on the server.
//
// TestPlantedBugs plants known bugs in the library (internal/plant: a Guard
// that checks nothing; acquisitions, renewals and breaks committed
// asynchronously, which a server crash can undo after they were answered) in
// the workers of a run and asserts that the oracles report each, so a green
// run means something. A planted run stops at the first violation (the
// history so far is checked every two seconds), and goes on until then for
// up to 120 s, not the default size: the bug shows only when a fault strikes
// at the right moment, and a run under a CPU hog once ended at the default
// size without it.
package chaos
