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
// (restarted), SIGSTOP … SIGCONT of a worker, and an immediate restart of
// the server.
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
//     that it still held its lease (live Context, trust deadline ahead);
//   - after the run: no row held, no worker session left on the server.
//
// A test plants known bugs (internal/plant) in a worker and asserts that the
// oracles report them, so a green run means something.
package chaos
