// Package lease provides leases on PostgreSQL: named locks that outlive
// connections and processes, held by a UUID owner for a TTL judged by the
// database clock, and carrying a fencing token that only ever grows.
//
// Use a lease where a lock must survive its connection: a job handed from
// an API process to a worker ([Handle], [Store.Resume]), a nightly run that
// renews while it works ([WithKeepAlive], [Store.Do]), a resource whose
// writes must be refused once the lock has moved on ([Lease.Guard],
// [Lease.Token]). For locks that should die with their session, use the
// advisory package instead.
//
// # Model
//
// A [Store] works on one table (default public.pglocks_leases; see
// [SchemaSQL] and [Store.Migrate]) through a pgxpool.Pool. Each name has one
// row, never deleted. [Store.TryAcquire] takes the row when it is free,
// released or expired, in one statement and one round trip, giving the new
// holder token = previous token + 1; when the row is held it reports the
// holder in a [*HeldError] without locking or writing anything.
// [Store.Acquire] waits: a release wakes it at once through LISTEN/NOTIFY,
// and a holder that vanished is noticed at the expiry the failed try
// reported. A [Lease] renews ([Lease.Renew]), releases ([Lease.Release]),
// asks the server how long it has left ([Lease.Assert]) and guards writes
// in the caller's own transaction ([Lease.Guard]). Renew, Release, Assert
// and Guard are scoped to (name, owner, token): a wrong owner, another
// token, an expired lease and a missing row all give [ErrNotHeld].
//
// # Time
//
// Every expiry decision is made in SQL with the server's clock, so client
// clocks may be wrong by hours without effect. Locally a holder trusts its
// lease only until the send time of its last successful acquire or renew +
// TTL − a safety margin ([Config.SafetyMargin]), measured on Go's monotonic
// clock; when that deadline passes without a renewal, [Lease.Lost] is closed
// and [Lease.Context] cancelled, before any other client can have acquired
// the lease (as long as the client's and server's clocks run at about the
// same rate).
//
// # Fencing
//
// The token is bumped in the statement that changes ownership and kept
// across release, expiry, takeover, [Store.Break] and server restarts (it is
// a committed row). Two ways to use it:
//
//   - In the same database: call [Lease.Guard] inside the transaction that
//     writes. It checks owner, token and expiry at that moment and locks the
//     row FOR SHARE, so no takeover or Break can commit until the
//     transaction ends; the writes commit only while the lease is held.
//   - Elsewhere: send [Lease.Token] with each write to the protected
//     resource, which remembers the highest token it has seen and refuses
//     lower ones.
//
// # What this does not guarantee
//
//   - A paused process cannot be stopped. A holder frozen by a GC pause, a
//     stopped VM or a slow disk may resume after its lease has expired and
//     act on it: nothing in a lease can prevent that. Fencing can — guarded
//     transactions and token checks refuse the stale holder's writes.
//     Unfenced side effects (an email, a call to an API that ignores the
//     token) may happen twice.
//   - Tokens are as durable as the database. After a failover to an
//     asynchronous replica, recently committed acquisitions can be lost and
//     a token handed out again; use synchronous replication (or fence with
//     something that survives failover) if that matters.
//   - The local trust deadline assumes the client's monotonic clock does not
//     run much slower than the server's; the safety margin absorbs modest
//     drift, not a stopped clock.
//   - Acquire is not fair: waiters woken by a release race for the lease,
//     and a newcomer's TryAcquire may win.
//   - A Guard's FOR SHARE lock also holds back the holder's own renewals
//     until the guarded transaction ends: keep such transactions short
//     beside the TTL.
//
// # Waiting
//
// A store opens one extra connection, on the first Acquire that has to
// wait, and keeps it until Close: it LISTENs on Config.Channel and, while
// a name has waiters, holds a shared session advisory lock on the bigint
// key KeyOf("pglocks.lease:" + channel + ":" + name) (see package pglocks).
// A release notifies only when it cannot take that key itself, so releases
// that nobody waits for send no NOTIFY, whose commit-time lock would
// otherwise serialize busy releasers. Do not take these keys elsewhere: at
// worst a waiter then wakes at the holder's expiry instead of at once.
//
// Behind PgBouncer in transaction pooling mode, TryAcquire, Renew, Release,
// Guard and the rest work (every statement stands alone), but a waiting
// Acquire's connection needs a real session for its LISTEN and its interest
// locks: give the store a pool that reaches PostgreSQL directly if you use
// Acquire or Do, or use TryAcquire with your own retry.
package lease
