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
// how every oracle treats it (the linearizability check may leave it out
// when it cannot change what the model allows, below), never as failed.
//
// The workloads: lease (clients contend for a few names: acquire, guarded
// writes, reads, release or abandon), advisory (exclusive and shared
// locks), leader (one candidate per election in every worker, fenced
// writes per term) and semaphore (TestSemaphoreChaos: 8 clients in each of
// 4 workers take 1 or 2 permits of a semaphore of limit 3 — half of them
// of a lease semaphore, TryAcquire or Acquire with a random deadline, a
// guarded write per permit with that permit's Guard, then a release or
// abandonment to expiry; half of an advisory semaphore, whose holders
// report each permit's verified window. Its size is counted in lease
// semaphore acquisitions: 200 by default, 10,000 with PGLOCKS_STRESS=1).
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
// committed asynchronously; local servers only); the semaphore run adds
// pg_terminate_backend of a session that holds an advisory lock (a
// permit's). CHAOS_FAULTS=kind,kind
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
// TestPatroniChaos (opt-in: PGLOCKS_PATRONI=1; some 7 minutes) runs the
// four workloads, one after another, each in a database of its own on one
// real Patroni cluster (pgtest.NewPatroni: two nodes, synchronous mode,
// etcd, HAProxy), the even worker slots on its multi-host DSN
// (target_session_attrs=read-write), the odd ones through HAProxy, with
// no proxies. Faults: terminations (and termholder), kills and stops of
// workers, crashes of the primary's server, and the Patroni faults of
// patroniFaults (patronictl switchover, SIGKILL of the primary's
// postmaster, SIGKILL of the primary's Patroni and postmaster together,
// and where the nodes run in network namespaces primary-partition, the
// primary cut off from etcd, clients and its standby until healed),
// which a player of their own injects one at a time beside the schedule,
// each once the primary streams to a synchronous standby, and each
// followed by its recovery (a synchronous standby again) before a crash
// may strike. Append a fault there as pgtest offers more; CHAOS_FAULTS
// may name any fault pgtest's Patroni.Fault knows. A run has the
// workload's default size and at least one of each Patroni fault
// (8 minutes at most), reads lock the row as in the promotion run, and
// the oracles are the same; each run reports its failovers: fault → new
// primary writable (pgtest's poller), → the workers' operations
// acknowledged again, → a synchronous standby again.
// TestPatroniChaosPause (CHAOS_PATRONI_PAUSE=1 as well) runs the lease
// workload on a cluster of its own through one pgtest.FaultPauseLong and
// only logs what the oracles report: with Debian's Patroni 3.0.2 a
// paused primary takes the leader key back when continued and the
// promoted node's acknowledged commits are lost (docs/compatibility.md),
// which is why the synchronous leg leaves the pause out.
//
// The oracles:
//
//   - linearizability of each name's history, checked with porcupine against
//     a model of a fenced lock: acquire → ok(token) / busy / unknown,
//     release, guarded write(token) → accepted / refused / unknown, read.
//     A semaphore's permit slot ("s#0" …) is such a lock: an acquisition
//     of n permits is one acquire per slot below the limit, called
//     together, returning ok with its token on the slots it got and busy
//     on the others (unknown on all of them, if its outcome is); its
//     release one release per permit: so each slot's tokens only grow, and
//     a permit's guarded writes are accepted only while its token is the
//     slot's newest. Operations that cannot change what
//     the model allows (busy acquires, refused writes, not-held and unknown
//     releases, unknown acquires, reads with no result) are left out of
//     the check, which decides the same without them;
//   - a counter incremented only inside guarded transactions ends between
//     the number of acknowledged increments and that number plus the
//     increments whose outcome is unknown;
//   - no two acquisitions of a name are trusted at overlapping instants:
//     each holder reports the interval over which it checked, and found,
//     that it still held its lease (live Context, trust deadline ahead),
//     which starts at the latest when Acquire returned the lease;
//   - never more than a semaphore's limit of permits trusted at any
//     instant, counting the trust windows of all its slots across every
//     process (not in the model: expiry, which frees an abandoned permit,
//     has no place in a model without a clock);
//   - after the run: no row held (a permit, a semaphore's turn), no
//     advisory lock held, no worker session left on the server.
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
