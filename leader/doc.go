// Package leader elects one leader among candidates — replicas of a service,
// or one per tenant or shard — on PostgreSQL, with sub-second failover after
// a crash and fenced terms.
//
// An [Elector] combines two primitives. A session advisory lock (package
// advisory) gates the campaign: PostgreSQL frees it the moment a crashed
// leader's connection closes, so the next candidate is elected at once
// instead of a lease later. A lease (package lease) carries the term — its
// fencing token, which only grows — the leader's identity and expiry, is
// renewed by the leader and read by everyone, and keeps the election safe
// when a leader is only cut off.
//
//	          Run
//	           │
//	           ▼
//	     ┌───────────┐  advisory lock taken, lease taken     ┌──────────┐
//	┌───▶│ candidate │──────────────────────────────────────▶│  leader  │
//	│    └───────────┘   (term = lease token; OnElected)     └──────────┘
//	│          ▲  every RetryInterval: read the lease row;         │
//	│          │  OnNewLeader; terminate a stale leader's session  │
//	│          │                                                   │ session died, lease lost,
//	│    ┌───────────┐  work cancelled and returned; lease         │ trust deadline passed,
//	└────│ stepping  │◀─ released, lock unlocked; OnDemoted ───────┘ Resign, work returned,
//	     │   down    │                                               Run's ctx ended
//	     └───────────┘  (after Resign or work returned: sit out RetryInterval)
//
// # Campaign
//
// A candidate waits for the advisory lock on [pglocks.KeyOf]("pglocks.leader:"
// + name): a release wakes it through LISTEN/NOTIFY, a crashed holder's lock
// is picked up by the advisory package's short backoff. Holding the lock, it
// acquires the lease "pglocks.leader:" + name. If the previous leader still
// holds the lease — it crashed, or its session was terminated — the
// candidate waits until Grace has passed since it took the lock (a release
// ends the wait at once), then breaks the lease and takes it over.
//
// That is safe because a leader trusts its advisory session only until Grace
// after the send time of the last round trip that succeeded on it, and its
// lease only until the send time of its last successful renewal + TTL −
// margin, both on the monotonic clock: once either deadline passes, the
// leader's work context is cancelled and it steps down. A session that
// answered at time s held the lock at s; the lock was freed later, so the
// new candidate took it after s and waits until after s + Grace.
//
// # A partitioned leader
//
// When a leader is cut off from the database, it stops trusting its session
// Grace after its last successful round trip, and steps down: its work is
// cancelled well before anyone else can lead. The server, though, may keep
// its session — and the advisory lock — for a long time. The advisory
// package sets per-session TCP keepalives and tcp_user_timeout so that the
// server drops such a session within about ten seconds by default. Should it
// not (other settings, a middlebox), the candidates see the lease expire by
// the server clock while that session still holds the lock: the lease row
// records the leader's session pid, and a candidate terminates exactly that
// session (pg_terminate_backend; Config.NoTerminate turns this off). So the
// election makes progress within TTL + RetryInterval of the leader's last
// renewal, given the privilege to terminate — the same role, or membership
// in pg_signal_backend — and otherwise as soon as the server drops the
// session.
//
// # Fencing
//
// The leader's work receives its [Term]. Writes to the database that must
// not come from a deposed leader go through [Term.Guard] inside their own
// transaction: it checks, by the server clock, that the term is current and
// locks the lease row FOR SHARE until the transaction ends, so no later term
// can begin while it is open. Resources elsewhere can compare [Term.Number]
// with the highest term they have seen.
//
// # Observing
//
// [Elector.Leader] reads the current leader; [Elector.Observe] streams
// changes (LISTEN/NOTIFY, with polling as the fallback), for followers that
// forward requests to the leader. Hooks (OnElected, OnDemoted, OnNewLeader)
// run on a goroutine of their own and never hold up the election.
//
// # Many elections
//
// Elections share one advisory Locker (a few sessions hold every election's
// lock) and one lease Store: a thousand elections in one process do not need
// a thousand connections.
//
// # What is guaranteed, and what is not
//
//   - At most one candidate trusts a term at any instant, provided the
//     candidates' monotonic clocks run at about the server's rate (the lease
//     safety margin absorbs modest drift). Terms strictly increase, across
//     crashes, takeovers and server restarts.
//   - A crashed or killed leader is replaced within about Grace (default
//     three advisory ping intervals, 600ms) plus a few round trips; a
//     terminated session likewise; a resigning leader within a few round
//     trips; a partitioned leader within TTL + RetryInterval (see above).
//   - A paused process — a long GC pause, SIGSTOP, a frozen VM — cannot be
//     stopped from acting when it resumes, before its own timers run. Only
//     fencing stops its writes: guard them with the term. Unfenced side
//     effects may happen twice.
//   - Terms are as durable as the database: after a failover to an
//     asynchronous replica a term number may be handed out again, and
//     advisory locks do not survive a failover at all (every session is
//     gone; a new election follows).
//   - Behind PgBouncer in transaction pooling mode, session advisory locks do
//     not work: point the Locker's pool at PostgreSQL directly.
//   - Elections are not fair: after a leader steps down, any candidate may
//     win.
package leader
