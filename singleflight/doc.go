// Package singleflight runs a function once across processes for concurrent
// calls with the same key (deduplication of work): the first caller
// takes the key's advisory lock, computes, and stores the result with a
// TTL; the others wait on the lock and then read the stored result instead
// of computing it again. Later calls read it until it expires.
//
// Results are stored by a [Results] implementation: [Table] keeps them in a
// PostgreSQL table; any other cache (Redis, memcached, a blob store) can
// implement the two methods.
//
// # What is guaranteed
//
// A stored result was computed by an fn that ran, from its start to its
// return, while its caller held the key's lock. So no two stored results of
// a key were computed at the same time, and errors are never stored (the
// next caller runs fn again). A call that finds an unexpired result when it
// looks — before it waits for the lock, and again once it holds it —
// returns that result without running fn.
//
// How the lock is known to have held: a session advisory lock ends only
// when it is unlocked or its session ends, and Do unlocks only after the
// store, so a session that still holds the key after fn returned has held
// it all along. When Results is a *[Table] itself, the statement
// that writes the result checks that itself ([Table.PutHeld]): it writes only if pg_locks
// shows the lock's session (its pid and, where the Table's role may read
// its backend_start, its start time) holding the key exclusively, and, when
// it meets another store's row, checks again once it holds that row (after
// waiting for that store to end), so a store never overwrites a result
// computed under a later hold (but see an unknown outcome, below). With any
// other Results — a wrapper that embeds a Table included, whose own Put
// Do calls — Do puts the result only after one round trip on the lock's
// session, sent after fn returned, was answered while the lock was held
// ([advisory.Lock.Verify]).
//
// # What is not guaranteed
//
// An fn whose lock is lost mid-way (its session died) may overlap a second
// one: the server frees the lock at once, and the holder's Locker notices
// only at its next round trip (within PingInterval for a killed session),
// when fn's ctx is cancelled. Its result is not stored: Do returns an error
// wrapping [ErrNotStored] and [advisory.ErrLost], from the check after fn
// or from the store's own.
//
// The store's check is not its commit. A Table's statement checks the lock,
// writes the row and then commits; if the holder's session dies after the
// check, the result still commits — it was computed under the lock. Until
// the commit is visible (the rest of the statement, the WAL flush and, with
// synchronous replication, the standby's answer), a caller that took the
// freed lock finds no result and runs fn again — not at the same time as
// the first fn, which returned before the check — and its store waits for
// the first one's row and then replaces it.
//
// With a Results that cannot fence (Put only), the lock is known held only
// up to the send of the verifying round trip. A Put that lands after the
// lock was lost, however late (a slow or retried write), is stored all the
// same and can replace the result of a later holder.
//
// A store whose reply was lost returns an error wrapping [ErrStoreUnknown]:
// the result may or may not be stored, and Do unlocks. The server may still
// run such a statement later; a Table's then stores only if its check
// passes when it runs — normally not, as the lock is gone, but if this
// process has taken the key again on the same session (the check names a
// session, not a hold), it stores the older result, which may then replace
// a newer one.
//
// A Table's check reads pg_locks, which scans the server's whole lock
// table: its cost grows with max_connections × max_locks_per_transaction
// and with the number of locks held on the whole server, and it is paid
// twice when the key has a row, expired or not (see BenchmarkStore). Measured
// on a loaded 2-core machine at 500 × 128: a store cost 0.8–1.1 ms with no
// other lock held, 1.5 ms with 1,000 held, 4.9 ms with 5,000 and 47–150 ms
// with 30,000 (a plain Put: 0.1 ms). On a server holding many locks, put a
// cheap Results in front (any type other than *Table gets Put after one
// verified round trip instead). It needs the Table in the database of the
// Locker's sessions. It names the session by its pid and, where the Table's
// role may read the session's backend_start (the same role, or
// pg_read_all_stats), by having started before clock_timestamp() minus the
// time, measured on the client's monotonic clock, since the session last
// answered: a backend that reused the pid of a dead holder started later.
// Without that column only the pid names it, and such a backend holding the
// same key would pass the check (the operating system must first cycle
// through all its pids). A server clock stepped back by more than the
// session's age fails the check (nothing stored).
package singleflight
