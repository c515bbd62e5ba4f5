// Package advisory provides PostgreSQL advisory locks on [pglocks.Key]s:
// session-scoped locks held by a [Locker], and transaction-scoped locks
// taken in a caller's transaction with [XactLock] and [TryXactLock].
//
// # Which one to use
//
// Session locks ([Locker.Lock], [Locker.TryLock], [Locker.RLock],
// [Locker.TryRLock], [Locker.Do]) are held until unlocked or until the
// session that holds them ends. They suit long holds: "only one replica
// runs this job; if it dies, the next takes over at once". The server frees
// a crashed holder's locks as soon as its connection closes, and a Locker
// announces the loss of a lock through [Lock.Lost] and [Lock.Context], and
// cancels fn's context in [Locker.Do].
//
// Transaction locks ([XactLock], [TryXactLock], [XactRLock],
// [TryXactRLock]) live inside one transaction and end at its commit or
// rollback. They suit short critical sections that already run in a
// transaction, and they are the only kind that works through a pooler in
// transaction mode.
//
// A session lock on a connection of the caller's own (SessionLock,
// TrySessionLock, SessionUnlock on a *pgx.Conn; package stdsql does the same
// on a *sql.Conn) suits a tool that already works on one connection and
// wants the lock to die with it, such as a migration tool (package
// gooselock). The session is checked as a Locker checks its own (refused
// behind transaction or statement pooling and on a standby), the wait polls
// as XactLock does, and a lock or unlock statement that fails after it was
// sent closes the connection, which frees whatever it held
// (TestSessionLockOnConnLostReply). Nothing watches such a lock: the caller
// learns of its loss only from its connection's next statement.
//
// # WARNING: session locks are UNSAFE behind PgBouncer transaction pooling
//
// A session lock belongs to a server session. Behind PgBouncer (or any
// pooler) in transaction pooling mode, consecutive statements of one client
// connection may run on different server sessions, and a server session
// moves between clients: a lock can be taken on one session and "released"
// on another, leak to an unrelated client, or be freed while its holder
// still believes it holds it. Use session locks only over direct
// connections or a session-mode pooler (the Locker adds no startup
// parameter but application_name, which poolers accept). Behind a
// transaction-mode pooler use transaction locks, or the lease package.
//
// A Locker checks: when it opens a session whose startup process id is not
// its backend's (a pooler announces its own), it probes whether the pooler
// keeps each client on one server session — it marks the session with a
// session setting and reads the mark back several times in a row, from a
// second connection's open transaction, and again while that transaction
// is open — and behind transaction or statement pooling every session-lock
// operation fails with [ErrTransactionPooling], at once and without
// retrying. The verdict rests on session state the server shows, whatever
// order the pooler reuses its server sessions in (TestPoolerMatrix: PgBouncer
// in every mode, most recently used first and in turn, pools of 1 to 20;
// TestTransactionPoolingRefused; the behaviour tests pass through a
// session-mode PgBouncer: TestViaSessionBouncer). A pooler that announces
// the pid of the server session it lends first is taken for no pooler, so
// do not rely on the check alone with other poolers; Pgpool-II does that
// and keeps each client on its backend, rightly so. [Lock.PID] is the
// backend's real pid, read after connecting.
//
// Behind a session-mode pooler a partitioned holder's locks are freed in
// bounded time too, but not by the server's TCP settings: those act on
// the pooler's link to the server, which stays healthy, and PgBouncer keeps
// the server session as long as it keeps its dead client (its client TCP
// keepalive: about two hours with the OS defaults). Each session that
// holds locks therefore sets idle_session_timeout to Config.TCPUserTimeout
// and ends itself once its pings stop (PostgreSQL 14 and later; older
// servers keep the locks of a holder partitioned from the pooler until the
// pooler drops it). TestPartitionedHolderFreed measures it through a real
// session-mode PgBouncer with the default Config: the holder announces the
// loss about 2 s after the cut and the server frees the lock about 10 s
// after it, as over a direct connection (before, never).
//
// Transaction locks run their statement in pgx.QueryExecModeExec when the
// connection caches prepared statements (pgx's default), so they work
// behind transaction pooling in every exec mode
// (TestXactThroughTransactionPooling).
//
// # How a Locker holds locks
//
// A Locker is built from a *pgxpool.Pool with [New] and a [Config]. It never
// holds a lock on a pooled connection: it opens up to Config.MaxSessions
// (default 3) dedicated sessions the way the pool opens its connections
// (its ConnConfig, BeforeConnect and AfterConnect hooks) and holds any
// number of locks on them, plus one connection that LISTENs for wake-ups:
// at most four server connections by default, for ten locks or ten
// thousand. [New] opens none of them; the first lock asked for does. Only
// application_name goes in the startup packet; after connecting, and after
// the pooler check below (so that a connection refused there leaves no
// setting on a server session the pooler lends to others:
// TestRefusedDialLeavesNoSettings), each connection SETs the server's
// tcp_keepalives_* and tcp_user_timeout, and its idle_session_timeout (to
// Config.TCPUserTimeout, on PostgreSQL 14 and later), so that a
// partitioned holder's session, and its locks, are dropped by the server
// in bounded time, directly or behind a pooler (see [Config]); it sets
// statement_timeout, lock_timeout and idle_in_transaction_session_timeout
// to 0, so that a role's or database's defaults cannot cancel a try or
// unlock or end a session that holds locks. The LISTEN connection holds no
// lock but has the same idle bound, and sends a round trip every
// TCPUserTimeout/2 whatever notifications arrive, so that one cut off
// behind a session-mode pooler is ended by the server too, rather than
// kept, with its pooler slot, for hours (TestPartitionedListenerEnds). If
// the server or a pooler refuses any of these settings, the connection is
// not used: opening it fails with the server's error. An idle session holding locks is pinged at least every
// PingInterval (every TCPUserTimeout/2 if that is shorter), so its death
// is announced within about PingInterval + QueryTimeout; one holding none
// every TCPUserTimeout/2. So the server hears from every healthy session
// at least every TCPUserTimeout/2, and its idle bound (TCPUserTimeout)
// leaves a holder whose process stalls — a GC pause, an overloaded
// machine — TCPUserTimeout/2 at least before its locks are freed
// (TestPingCadence, TestHealthyIdleHolderKept).
//
// Session locks are re-entrant per session in PostgreSQL; the Locker
// excludes its own holders from each other (exclusive and shared alike), so
// two goroutines never share a lock by accident.
//
// PostgreSQL makes every statement on a session slower by about 75ns per
// lock the session holds (each transaction end scans the session's lock
// table), so a Locker spreads many locks over its sessions; ten thousand
// locks on three sessions add about a quarter of a millisecond to each
// try or unlock. The server's lock table must have room for them too (see
// "Capacity").
//
// Waiting never happens on the server: a pg_advisory_lock that a client
// cancels by closing its socket stays queued on the server (a "ghost
// waiter") and may still take the lock. [Locker.Lock] instead retries a
// one-round-trip try: at once when a pglocks holder anywhere unlocks the
// key, else with jittered backoff up to Config.MaxBackoff, which is how
// locks freed by crashed holders or by plain SQL clients are picked up.
// A waiter that fails a try asks, by NOTIFY on Config.Channel, to be told;
// the holder's locker hears it, and its unlock then notifies in the same
// round trip, so an uncontended unlock costs no NOTIFY. A waiter asks on
// its first failed try, on the first after a wake-up (a new holder has not
// heard it) and every 2 s, not on every poll: a lost request costs only
// latency, up to MaxBackoff. A locker keeps, for 2 s, the asks it hears
// for keys it does not hold, so that a Lock of its that takes such a key
// from a client that sends no wake-up (plain SQL, a crashed process)
// still notifies (TestAskHeardBeforeHolding). An unlock notifies only when
// it frees the key: not while another Lock of the locker still holds it
// on the same session (TestSharedUnlockOnFullTable).
//
// Every Locker's listener receives every event on the channel, for every
// key, and each event is a commit that wakes every listening backend:
// the cost grows with Lockers × events. BenchmarkFanout measures it with 50
// Lockers in one process and 1,000 waited-on keys on a 2-core machine:
// each delivery of an event costs its listener's backend about 14 µs of
// CPU and the client 2–15 µs, so one event costs about 1–2 ms of CPU in
// all, more than the try or unlock that sent it. When waiters asked on
// every poll, the waiting alone saturated the server at about 1,050
// events/s and handing the 1,000 keys over took 40 s; asking sparingly,
// the first second of waiting sends one event per waiter (a longer wait,
// one more every 2 s: 1,000 waiters, 500 events/s) and the hand-over
// takes 9 s, 3.8
// events per unlock, still most of its CPU in the listeners. Many Lockers
// waiting on many keys is the case to avoid: share one Locker per process,
// or give groups of Lockers that share no keys their own Config.Channel
// (Lockers on different channels still exclude each other, but wake each
// other only by polling).
//
// Every call honours its ctx exactly: when ctx ends during a statement,
// the call returns at once, and the session reads the answer in the
// background and gives back a lock taken after the caller left. The
// session is not closed for it, so other locks on it are not disturbed.
//
// # Several keys at once
//
// [Locker.TryLockAll] takes a set of 1 to [MaxKeys] (64) distinct valid
// keys, all or none, exclusively, on one session, in one round trip: one
// statement tries the keys in sorted order and, if any is held elsewhere,
// unlocks in the same statement those it took, so a failed try leaves
// nothing held (TestTryLockAllLeavesNothing checks pg_locks).
// [Locker.LockAll] repeats that try, woken as Lock is, and holds nothing,
// here or on the server, while it waits: callers asking for overlapping
// sets in any order cannot deadlock (TestLockAllStress: 16 contenders on
// three Lockers, random sets of 1–5 of 8 keys; every held set checked in
// pg_locks). It does not queue: a caller for many keys can be passed over
// by callers for few (see Semaphores for a turnstile). The set is a
// [Locks], lost together with its session. An empty set, a duplicate key,
// more than MaxKeys keys or an invalid key is refused before anything is
// sent. Outcomes are those of "When a statement fails": a reply that never
// came closes the session, which frees whatever the statement took; a
// server error is settled from pg_locks, and every key of the set that the
// session holds is unlocked before the error is returned (the session is
// closed if that fails). In this process, a set is busy when a Lock of the
// Locker holds one of its keys; a key another set of this process is
// trying at that moment is waited for, for that one round trip, rather
// than reported busy.
//
// # Semaphores
//
// [Locker.Semaphore] returns a counting semaphore: at most limit permits
// held at once by all the processes that use its name. Permit slot i is
// the exclusive lock on [SlotKey](name, i), KeyOf("pglocks.sem:" + name +
// ":" + i): in SQL, hashtextextended('pglocks.sem:' || name || ':' || i,
// 0). [Semaphore.TryAcquire] takes n free slots below the limit, all or
// none, with the statement of TryLockAll (taking n of the slots, from a
// random one on, and giving back those it took if it finds fewer than n;
// a single permit tries at most 4 free slots a statement). A permit dies
// with its session, like any lock here: a crashed holder's permits are
// free at once, and [Permits.Lost] and [Permits.Context] announce the loss.
//
// Waiting is the Locker's, never on the server: [Semaphore.Acquire]
// retries the try, woken when a permit is released (at once in this
// process; by NOTIFY from another, since a failed try asks the holders of
// its first 16 slots and of the turnstile to notify), else by backoff up
// to MaxBackoff.
//
// Fairness rests on the turnstile key, [TurnstileKey](name) =
// KeyOf("pglocks.sem:" + name + ":turnstile"). Every try takes it shared
// for its own statement only (pg_try_advisory_xact_lock_shared) and takes
// nothing without it; an Acquire of n > 1 permits holds it exclusively
// (waiting for it as Lock does) while it gathers, so that new takers stop
// and released permits go to it: a stream of single takers cannot starve
// it (TestSemaphoreNoStarvation: a waiter for 2 of 2 permits under four
// looping single takers on two Lockers gets them in 8–44 ms). A
// TryAcquire fails with ErrLocked while a gatherer holds the turnstile,
// even if permits are free.
//
// Advisory locks have no table to keep a limit in: each handle has its
// own ([Semaphore.SetLimit]) and grants only slots below it. Where
// processes disagree, the bound in force is the largest limit in use;
// after a limit is lowered, slots at or above it are not granted anew by
// that handle, and permits held on them are never revoked.
// [Semaphore.Count], [Semaphore.Holders] and [SemaphorePermits] read
// pg_locks (granted locks on the slots below [MaxLimit]); a waiter does
// not show there, as it waits in its process.
//
// Not guaranteed: FIFO order among single takers, or among gatherers
// (they wait for the turnstile as Lock waits); a client that takes slot
// locks without the turnstile can starve gatherers.
//
// # When the database is unavailable
//
// A Locker that cannot open a session says why. [Locker.TryLock] returns
// the cause of the failed dial (refused connection, wrong password 28P01,
// unknown role 28000, missing database 3D000, a pooler's refusal) after
// that one dial. [Locker.Lock] returns at once on a cause that retrying
// cannot cure (authentication, missing database or role, privileges), and
// waits through the others (refused or reset connections, a restarting
// server, too many connections), and when its ctx ends its error wraps
// ctx's error and the last cause.
//
// The rule for dials while they fail: a call that finds no session open
// and is made at least 25 ms (the shortest dial backoff) after the last
// failed dial ended dials again at once, so that a TryLock made once the
// server is back takes the lock (TestTryLockAfterRestartDialsAtOnce,
// TestTryLockAfterRefusalEndsDialsAtOnce). A call made sooner returns that
// dial's error, which says so: "the error of a dial that ended … before
// this call" (never more than 25 ms before). Only one dial is under way at
// a time, and every call that comes while it is shares it: when it fails,
// their errors say that it is "the error of a dial that started … before
// this call" (TestSharedDialErrorSaysItIsEarlier). So tries in a loop,
// however many and however tight, make about one dial per 25 ms at most
// (TestTryLockStormDialsPaced: 8 goroutines in a tight loop against a
// refused port, 40 dials/s where each try used to dial, over 6,000/s; 50
// goroutines every 10 ms, 35/s where they made 330–430). Every other dial
// is paced by a backoff per Locker: a waiting Lock's retries, and the
// dials that open more sessions to spread the load when sessions are
// open (TestSpreadDialsKeepBackoff: a role at its connection limit sees
// 4–5 rejected dials/s under load, not one per call) — the next dial
// 25–50 ms after a failure, doubling up to 0.5–1 s, so at most 2 dials
// per second at steady state. Measured on a 2-core machine
// (TestTryLockReportsDialCause, TestLockBacksOffThroughOutage, under
// -race too): TryLock returns the cause within 1–21 ms (refused: under
// 1 ms; wrong password: 10–21 ms); a Lock called just after returns a
// fatal cause within 46–59 ms (it waits for the next paced dial); a Lock
// waiting through a 5 s outage makes 10–11 connection attempts and uses
// 14–19 ms of CPU (0.3–0.4% of a core).
//
// A waiting Lock outlives its sessions: when the session it tries on is
// terminated, reset or lost in a server restart, it goes on waiting on
// another until ctx ends.
//
// On a failover, every lock is gone with the old primary (advisory locks
// are not replicated): held locks' Lost fires, and with a pool whose
// multi-host DSN has target_session_attrs=read-write the Locker reconnects
// to the new primary, where waiting Locks go on and acquire (TestFailover,
// 10 runs under -race on 2 cores: Lost 55–174 ms after the crash, median
// 129 ms; waiters acquire 21–574 ms after the promotion, median 190 ms).
// A session that reaches a standby — where
// advisory locks work but exclude only that standby's clients — is refused
// with [ErrStandby], at once, by TryLock and Lock (TestStandbyRefused).
//
// # Engines whose locks lie
//
// The Locker does not trust a version string: at its first connection to
// a server it proves that the server's session advisory locks exclude
// across sessions. It runs its own statements (extended protocol, binary
// parameters) for every form it sends — exclusive and shared, bigint and
// pair keys — on random keys, on that session and a second, short-lived
// connection: exclusive refuses both modes to the other session, shared
// grants shared and refuses exclusive, unlock frees (one more connection,
// two identity reads and 26 lock statements, a few milliseconds). Every
// session reads its server's identity (postmaster start time, port,
// database: one round trip) and a server proved before costs no more; a
// new one, after a failover or restart, is probed again. A probe
// connection that reached another server, a standby or the same backend
// is no verdict (the dial fails and the next probes again), and a failure
// is confirmed on a fresh pair before it is kept. Where the locks do not
// exclude — CockroachDB's advisory-lock functions return success and lock
// nothing — every session-lock operation fails at once with
// [ErrLocksDoNotExclude] (TestLocksThatDoNotExcludeAreRefused, against
// PostgreSQL whose own functions are made to lie). pglocks calls every
// advisory-lock function pg_catalog-qualified with typed parameters, so a
// schema before pg_catalog in the search_path, or an overload in another
// schema, cannot replace the function it reaches (TestShadowedSharedFormsOnly,
// TestFloat8OverloadInPublic). The probe runs its sessions with
// statement_timeout 0 and idle_session_timeout a minute (the dial's ctx
// bounds it; a role's 1 ms or 100 ms would make it no verdict), and then
// resets them to the role's defaults. The transaction locks
// ([XactLock] and its kin) run on the caller's transaction and are not
// probed per call: `pglocks doctor` checks them and clock_timestamp() too.
// Neither are the functions on a caller's connection ([TrySessionLock] and
// its kin).
//
// # When a statement fails
//
// Every try and unlock ends done, not done, or unknown (see
// internal/outcome); what that means for a session lock is decided in one
// place. A statement whose reply never came (a timeout, a reset, the
// session terminated) leaves the session silent or gone: it is closed,
// which frees on the server everything it held, and its locks are
// announced lost. A statement the server answered with an error (a
// pg_cancel_backend, a refused pg_notify) ran on a live session, perhaps
// part-way, and a session lock taken by a statement that then failed is
// still held: the Locker reads the session's locks from pg_locks and
// repairs its own state rather than close a session that may hold
// thousands of locks. A try that took the lock keeps it; one that took
// nothing returns the error; an unlock that did not unlock leaves the lock
// held and returns the error. Only when pg_locks cannot tell (its query
// fails, or another holder in this process shares the key on that
// session) is the session closed.
//
// # Capacity
//
// Every advisory lock held, by any session, takes an entry in the server's
// shared lock table, which is sized at server start: PostgreSQL documents
// room for max_locks_per_transaction × (max_connections +
// max_prepared_transactions) locks — 6,400 with the defaults (64, 100, 0)
// — shared by all sessions and all lock kinds (advisory locks, locks on
// shared catalogs, transaction ids; most table locks of a transaction
// use per-backend fast-path slots instead). A little more fits in fact:
// background processes count as connections in the sizing, and the table
// takes spare shared memory. Measured on PostgreSQL 15, one session took
// 12,806 advisory locks with the defaults, and 422 with
// max_locks_per_transaction = 10 and max_connections = 10 (TestLockTableFull;
// `pglocks doctor` prints the documented figure). Raising
// max_locks_per_transaction costs shared memory and needs a restart.
//
// When the table is full, TryLock, Lock, TryRLock, RLock, Do and the
// transaction locks fail with an error wrapping [ErrLockTableFull] and the
// server's error (SQLSTATE 53200, out of shared memory, "You might need to
// increase max_locks_per_transaction"). Lock and RLock return it at once,
// without waiting: the server is then failing every client that needs one
// more lock — table reads and writes, NOTIFY, even new connections — and a
// silent wait would hide it; call again once locks are released. Nothing
// was taken, the sessions are not closed, and the locks they hold stay
// held (the repair after a failed statement reads pg_locks, which needs no
// entry in the table). A Locker whose unlock cannot send its wake-up
// NOTIFY still unlocks; the waiter elsewhere polls.
//
// The lease and leader packages meet a full table too: a lease statement
// assigns a transaction id, whose lock needs an entry, so it fails with the
// same SQLSTATE and is retried as a transient error — an Acquire waits, a
// kept-alive lease whose renewals keep failing ends at its trust deadline,
// and a leader steps down then; an Elector's campaign gets ErrLockTableFull
// from its Locker and retries with its backoff.
//
// # Keys and psql
//
// A lock on [pglocks.KeyOf]("name") is the lock psql takes with
//
//	select pg_try_advisory_lock(hashtextextended('name', 0));
//
// so plain SQL clients and pglocks exclude each other. [Holders] and
// [IsHeld] show who holds a key, from pg_locks and pg_stat_activity.
//
// # What is not guaranteed
//
// A lock ends when its session does: on a server restart or failover (an
// advisory lock is not replicated), a terminated backend or a network
// failure. The Locker announces that, but a holder that is paused (GC,
// SIGSTOP) cannot be stopped from acting after the server freed its lock —
// which it may do once the pause outlasts Config.TCPUserTimeout/2, and does
// once it outlasts TCPUserTimeout (the lock sessions'
// idle_session_timeout): code that writes must also be fenced
// (see the lease package). Between a network partition and the server
// dropping the session, neither side can take the lock; Config's timing
// rule makes the holder give up first. Behind a session-mode pooler on
// PostgreSQL 13 or older nothing bounds that time but the pooler.
package advisory
