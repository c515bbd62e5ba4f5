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
// row, which this package never deletes — so a name's tokens only grow —
// unless asked to by [Store.Forget] or [Store.ForgetIdle], which delete
// free rows only and are only for names whose tokens fence nothing (a
// deleted name starts over at token 1; package leader uses them for its
// candidate and request rows, never for an election's term). [Store.TryAcquire] takes the row when it is free,
// released or expired, in one statement and one round trip, giving the new
// holder token = previous token + 1; when the row is held it reports the
// holder in a [*HeldError] without locking or writing anything
// (TestFailedTryWritesNothing, TestFastRetake). A Store that released a
// name itself takes it again with a cheaper statement that takes only a
// released row; if the row was taken since, the usual statement follows:
// two round trips, once — the Store then drops its hint.
// [Store.Acquire] waits: a release wakes it at once through LISTEN/NOTIFY,
// and a holder that vanished is noticed at the expiry the failed try
// reported. A [Lease] renews ([Lease.Renew]), releases ([Lease.Release]),
// asks the server how long it has left ([Lease.Assert]) and guards writes
// in the caller's own transaction ([Lease.Guard]). Renew, Release, Assert
// and Guard are scoped to (name, owner, token): a wrong owner, another
// token, an expired lease and a missing row all give [ErrNotHeld].
//
// # Setting up
//
// Create the table first, once per database: [Store.Migrate] (needs CREATE
// on the schema), the DDL of [SchemaSQL] in a migration tool, or
// "pglocks migrate". Everything else needs only USAGE on the schema and
// SELECT, INSERT and UPDATE on the table, and a primary: a standby serves
// [Store.Get], [Store.List] and [Store.IsHeld] only. A store that is not
// set up says so, and what cures it, from every operation — acquire,
// renew, release, inspect, break, Guard — and from [Store.Migrate]: the
// error wraps [ErrNoTable] (naming the table and the three ways to create
// it), [ErrNoPrivilege] (naming the role and the GRANT to run) or
// [ErrReadOnly] (point the pool at the primary), and the server's error;
// retrying cannot help, so [Store.Acquire] returns it at once, and so
// does the Run of a leader.Elector (TestNoTableNamesTheFix,
// TestNoPrivilegeNamesTheGrant, TestReadOnlyNamesThePrimary: a database
// with default_transaction_read_only and a real standby;
// TestMigrateReadOnlyNamesThePrimary). Guard speaks of the caller's
// transaction: its role, and a read-only transaction
// (TestGuardSpeaksOfTheTransaction). Only the server's refusal of the
// store's own statement, naming the store's table or schema, is
// explained so: an error raised in a trigger on the table, or about
// another object (EXECUTE on pg_notify), is returned as the server said
// it (TestSetupErrorsNameTheirObject). A store works
// behind any pooler, in every mode (see Behind a pooler): there is no
// pooler refusal to name.
//
// # Time
//
// Every expiry decision is made in SQL with the server's clock, at the
// moment the row is tested or changed (clock_timestamp(), not the
// transaction's start), so client clocks may be wrong by hours without
// effect, and a lease acquired or renewed after waiting for a row lock
// still gets its whole TTL. Locally a holder trusts its lease only until
// the send time of its last successful acquire or renew (plus the wait the
// server reports before it computed the expiry, capped by the round trip)
// + TTL − a safety margin ([Config.SafetyMargin]), measured on Go's
// monotonic clock; when that deadline passes without a renewal,
// [Lease.Lost] is closed and [Lease.Context] cancelled, before any other
// client can have acquired the lease (as long as the client's and server's
// clocks run at about the same rate).
//
// # Unknown outcomes
//
// A statement whose reply never came (a lost reply, a connection reset, ctx
// ending while it ran) may or may not have committed; the module's one
// classifier (internal/outcome) calls that Unknown. The rule, for every
// statement of this package: an operation whose outcome is unknown either
// provably cannot free, extend or take another acquisition, or ends local
// trust at once. No statement is scoped by owner alone:
//
//   - Acquire attempts record a fresh attempt id in the row. An attempt
//     whose outcome is unknown is cleaned up in the background by that id
//     alone — it cannot touch another acquisition, even one by the same
//     owner ([WithOwner]) — and TryAcquire returns at once, within its ctx.
//   - Renew is scoped to (name, owner, token): an unknown renewal can only
//     have extended this very acquisition, and the trust deadline moves
//     only on a confirmed one.
//   - Release is scoped to (name, owner, token). If its outcome is unknown,
//     another client may hold the name already: the Lease ends at once
//     (Lost, Context; Err wraps ErrLost and says the outcome is unknown) and
//     the release is retried in the background until the server answers,
//     for at most min(TTL, 30 s).
//   - A Release that was not sent (no connection: a server restarting; or
//     its ctx ended while it waited in the store's queue) ends the Lease
//     all the same, as released (Context's cause wraps ErrReleased; Lost
//     stays open, since nobody else can hold the name before the release
//     runs or the row expires), and the release is retried in the
//     background in the same way. So every Release ends its Lease: once it
//     returns, nothing renews the row, and a caller that drops its error —
//     a deferred Release, httplock, Do — strands no name
//     (TestReleaseNotSentEndsLease, TestDoReleaseNotSent).
//   - Break is an operator's act: its outcome is reported as it came.
//     BreakAcquisition is scoped to one acquisition (name, owner and
//     token): with an
//     unknown outcome it broke that acquisition or nothing, never a later
//     one (TestBreakAcquisition).
//   - Shared leases (see Shared leases) add reads, which change nothing
//     whatever their outcome, to these statements. A try that took its
//     row and then cannot read the other side gives the row back by
//     Release, under Release's rule; a reader never keeps a slot it could
//     not check.
//   - A lease ended at its maximum hold ([WithMaxHold]) has its row
//     released in the background, as after an unknown Release.
//
// # Durability
//
// Statements that grant ownership or extend an expiry (acquire, renew,
// resume, break) commit with synchronous_commit = on whatever the
// sessions' setting, so an acknowledged token is never handed out again,
// and no lease its holder trusts is shortened, by a crash. A release (and
// the cleanup of an unknown acquire) only gives ownership up, and does not
// wait for its WAL flush: one flush per acquire + release pair, not two. A
// crash may lose such a release — the row then shows the acquisition
// until its expiry, which delays the next holder but never makes two —
// and the next acquisition's synchronous commit flushes the WAL up to
// itself, the release included, before its token is handed out
// (TestReleaseLostInCrash). A session at a remote level (remote_write,
// remote_apply) keeps it for releases too.
//
// # Batches
//
// Under load a store combines its statements, a group commit on the
// client. A Release, and a TryAcquire or Acquire try of a name the store
// released itself (a fast retake), runs a statement of its own while
// fewer than Config.BatchAfter (8 by default) of its kind are in flight
// in the store; otherwise it
// joins a queue, and one goroutine at a time runs the queue (up to 128
// calls) as one statement — one round trip, one commit, one WAL flush for
// many calls — then the queue that gathered meanwhile. Alone, a call
// costs what it did; the figures are in docs/performance.md (BenchmarkThroughput).
// Every call keeps its own result and its own three outcomes:
//   - A batch waits for no row lock (SKIP LOCKED): a call whose row is
//     locked (a Guard's transaction, a racing writer) gets no answer from
//     the batch and runs its statement alone, which waits for the row and
//     decides; so a guarded transaction holds back no other call, and no
//     batch waits for another (TestBatchedReleases, TestBatchedRetakes).
//   - Two tries of one name in one batch: one wins, as they would alone
//     (TestFastBatch).
//   - A batch that fails without running — no connection, a
//     serialization failure, one call's input refused by the server —
//     fails no call: each runs its statement alone (TestBatchErrorRunsAlone).
//   - A call whose ctx ends while it is queued was never sent: TryAcquire
//     returns an error that is not an unknown outcome, and Release ends
//     the lease as released, its release retried in the background (see
//     Unknown outcomes; TestQueuedCallGivesUp).
//   - A call whose ctx ends once a batch took it returns at once with an
//     unknown outcome, whatever the ctx's cause (TestGivenUpInFlightIsUnknown).
//     The batch, which runs on a context of its own so that one caller
//     does not cancel the others' statement, leaves out the retakes given
//     up before it sends, and frees what it took for a caller that left
//     by attempt id after its own outcome is known, so that no late commit
//     outlives the cleanup (TestFastBatch). An unknown Release is settled
//     as any other (see Unknown outcomes).
//   - A batch whose own outcome is unknown makes every call's outcome
//     unknown, settled per call as for a statement of its own: its
//     backend is ended, then each acquisition is cleaned up by attempt id
//     (TestUnknownBatch).
//
// # Sets and semaphores
//
// [Store.TryAcquireAll] takes several names at once, all or none, in one
// statement and one round trip: each name gets its own [Lease] and token,
// as from TryAcquire. A try that finds any name held reports the holders
// in a [*HeldAllError] and takes no row lock and writes nothing
// (TestFailedTryAllWritesNothing). The statement never waits for a row
// lock (SKIP LOCKED, rows in name order), so calls over overlapping sets
// cannot deadlock: a row locked at that moment makes it take nothing and
// run again (TestAcquireAllNoDeadlock: 16 goroutines over random sets of
// 1–5 of 8 names). Its one wait: inserting a name that has no row yet
// waits for another transaction's uncommitted insert of that name (and
// then runs again if that one commits). A row that stays locked through
// a few tries (an expired lease's row under a Guard's open transaction)
// is reported as a HeldAllError whose [HeldError] has Locked set, rather
// than retried for ever (TestAcquireAllRegressGuardedExpired).
// [Store.AcquireAll] waits as Acquire does, woken by a release of any of
// the names, and polls locked rows with growing backoff. An unknown
// outcome is cleaned up by the attempt's id, in one statement over every
// name, after the attempt's backend is ended, as for one name. At most
// [MaxAcquireAll] (64) names; the Observer sees one Acquire event per
// name.
//
// A [Semaphore] ([Store.Semaphore]) grants at most limit permits at a
// time, across processes; a permit is a lease on the row "<name>#slot",
// so it has a token (the slot's, which only grows), renews, fences and is
// lost like any lease. [Semaphore.TryAcquire] takes n permits, all or
// none, in one statement: the lowest free slots. The limit lives in the
// row "<name>#limit", shared by every process: the first acquisition
// stores the limit given to Store.Semaphore, [Semaphore.SetLimit] changes
// it. That row is written held for good by the nil UUID, so a lease
// acquisition of its name reports it held and cannot overwrite the limit
// (TestSemaphoreRegressLimitRowNotALease); it shows in [Store.List]. The
// rule: a permit is granted only while the permits held (in any slot,
// above a lowered limit too) plus n, plus those a waiting turn reserves,
// do not exceed the limit; a lower limit revokes nothing, and the count
// may exceed it until enough permits are released (TestSemaphoreBasics).
// A grant holds the limit row FOR KEY SHARE and takes nothing if the limit
// changed since its snapshot, and SetLimit locks that row FOR UPDATE, so
// SetLimit returns only after every grant that used the old limit has
// committed, and every later grant sees their permits
// (TestSemaphoreRegressSetLimitRace); a stream of overlapping grants can
// delay SetLimit. While permits above a lowered limit are held, grants
// serialize on the limit row (TestSemaphoreRegressOverLimitRace). A
// lost race over slot rows is retried, and rows that stay locked are
// reported as a [*FullError] with Locked set, not as a full semaphore. A
// [Semaphore.Acquire] whose try failed takes the turn ("<name>#turn", a
// short kept-alive lease recording its n), and while it holds it others
// take permits only when enough remain for both, so the waiter holding the
// turn is not starved by smaller takers (TestSemaphoreNoStarvation, which
// fails without the turn); a turn for n = limit keeps every TryAcquire
// out until all permits are released. That is the whole fairness claim:
// the waiters without the turn compete for it in no particular order. A
// waiting Acquire registers with the listener for every slot up to the
// highest limit ever set, the turn and the limit row (a shared advisory
// lock each on the listener's session). Acquire never returns past its
// ctx: a turn release ctx cuts short goes on in the background. An
// unknown outcome is cleaned up by the attempt's id over every slot below
// [MaxSemaphoreLimit], whatever limit the caller knew
// (TestSemaphoreRegressUnknownAboveLocalLimit). [Permits] end when any of
// their leases does: their Context is cancelled, and Lost closed if it
// was lost. Under killed sessions and random deadlines the permits
// trusted at once never exceed the limit, and each slot's tokens grow
// (TestSemaphoreStress). The Observer sees one Acquire event named after
// the semaphore, and a Start per permit.
//
// # Guarantees, and the tests that hold them
//
//   - Tokens only grow — across release, expiry, takeover, Break, server
//     restart (TestTokensOnlyGrow, TestServerRestart) and a crash with
//     sessions at synchronous_commit = off (TestTokensSurviveCrash).
//   - Failover (see Failover): with a synchronous standby no acknowledged
//     acquisition is lost and no token is handed out twice
//     (TestFailoverSync); a token that went back below one the Store had
//     seen is refused (TestFailoverAsyncLag); a Store on a standby fails at
//     once with 25006 (TestStandbyRefused).
//   - One holder at a time: racing tries give one winner
//     (TestConcurrentTries); a failed try writes and locks nothing
//     (TestFailedTryWritesNothing).
//   - Lost and Context fire before another client can have acquired the
//     lease: on the trust deadline (TestTrustDeadline,
//     TestKeepAliveLongBlackhole); a deadline TrustedUntil returned as
//     passed is final, and no late renewal revives the lease
//     (TestLapsedTrustIsFinal);
//     on an unknown Release (TestAmbiguousRelease,
//     TestAmbiguousReleaseNotSent); an unknown
//     acquire never frees another acquisition and honours ctx
//     (TestAmbiguousAcquireWithOwner).
//   - Loss is announced promptly: a Break or a takeover ends the holder's
//     Lease at once through NOTIFY (TestBreakEndsHolderPromptly: ≤ 1 s at
//     TTL 30 s; TestTakeoverEndsHolderPromptly); a kept-alive lease checks
//     its row every Config.CheckInterval (TestKeepAliveRechecks) and renews
//     through killed connections (TestKeepAliveSurvivesKilledConnections).
//   - Keep-alives are batched: a store renews all its kept-alive leases in
//     one statement (one commit) per round, so leases of one TTL cost one
//     statement per renewal interval however many there are
//     (TestKeepAliveBatched: 300 leases, 3 statements in three rounds),
//     each lease still lost on its own when its row did not renew; a
//     Guard's locked row is skipped by the batch and renewed on its own,
//     so a guarded transaction holds back no other lease's renewals
//     (TestGuardHoldsBackOnlyItsLease). A Release first waits for any
//     renewal of its lease under way, so none commits after it.
//   - Calls are batched under load: a store's releases, and its retakes
//     of names it released, that find Config.BatchAfter statements of
//     their kind in flight queue and run as one statement (one commit)
//     per batch, each call still getting its own result and outcome
//     (TestBatchedReleases, TestBatchedRetakes, TestFastBatch,
//     TestReleaseBatch; see Batches above); the chaos suite's workers
//     batch with BatchAfter 1.
//   - Fencing: a stale holder's guarded write fails, and a takeover or
//     Break waits for an open guarded transaction (TestGuardStaleHolder,
//     TestTakeoverWaitsForGuard, TestGuardedCounterStress).
//   - One Lease per acquisition in a store: Resume of a Handle whose
//     acquisition the store holds as a live Lease returns that Lease, so
//     a Release through either reference ends it for both
//     (TestResumeLiveLease); an acquisition the store releases in the
//     background is not resumed there (TestResumeWhileReleasing).
//   - Client clocks do not matter (TestClockSkew).
//   - Nothing is left held by a caller who got an error: a cancelled wait
//     (TestAcquireCancelled), one cancelled while its statement waits for
//     the row — its backend is terminated (or, without the privilege,
//     waited for) before the cleanup, which could otherwise precede the
//     statement's late commit (TestCancelledAcquireStrandsNothing) — an
//     acquisition racing Store.Close (TestCloseRacesAcquisitions); and no
//     name is kept alive by a Release that failed: a release that could
//     not be sent while the server restarted frees the row once it is
//     back (TestDoReleaseNotSent; httplock's TestLeaseReleaseDuringOutage).
//   - Waits end as they should: a release wakes a waiter at once
//     (TestAcquireWaitsForRelease, TestListenerKilled), a vanished holder at
//     its expiry (TestAcquireWakesAtExpiry); serialization failures, dead
//     sessions and restarts are retried (TestSerializableDatabase,
//     TestAcquireFirstTryTransient), a closed pool is not
//     (TestAcquireClosedPool).
//   - Bad input gives an error naming it, never a panic (TestBadInput,
//     TestNilArguments, TestKeepAliveMarginChecked, TestLongNameInErrors),
//     before anything is sent: a Config.Hostname the server would refuse
//     as text fails New, metadata its jsonb would refuse fails the acquire
//     call with an error no retry cures (TestHostnameCheckedAtNew,
//     TestMetadataCheckedBeforeSending; the rules are pinned to the
//     server's by TestServerRefusesWhatChecksRefuse);
//     so does every method of a nil or zero Store or Lease — a nil *Lease
//     is what a failed TryAcquire returns, and a deferred Release of it
//     returns an error (TestQuickStartBusy; internal/nilsafe's TestMethods
//     calls every exported method of the module that way).
//   - The listener's memory and goroutines stay flat under notification
//     floods (TestListenerFlatOverNotifications); every goroutine is joined
//     (goleak in TestMain).
//
// # Failover
//
// Point the pool at every node with a multi-host DSN and
// target_session_attrs=read-write (host=a,b port=5432,5432
// target_session_attrs=read-write): pgx then connects to whichever node
// accepts writes, before and after a promotion. With a synchronous standby
// (synchronous_standby_names set, synchronous_commit on or higher, which
// every acquisition and renewal asks for), a failover loses no acknowledged
// acquisition and hands out no token twice, acquisitions in flight at the
// crash included (TestFailoverSync).
//
// A commit waiting for the synchronous standby can be cut short: when its
// session is terminated it stays committed on the primary alone, visible,
// and a promotion loses it (TestSyncCommitCutShort); when its query is
// cancelled, PostgreSQL even reports success, with a WARNING. A Store
// therefore trusts no acquisition, renewal or resume whose success came
// after the caller's ctx ended — pgx's CancelRequestContextWatcherHandler
// cancels exactly then — and treats it as an unknown outcome
// (TestSyncCancelledCommit). A cancel it cannot see — statement_timeout
// expiring in the wait, pg_cancel_backend — is acknowledged as success and
// can be lost: do not set statement_timeout on the Store's pool below the
// time a standby may take to confirm, and do not cancel its sessions. What
// a plain read returns — Get, List, IsHeld, Assert, a HeldError — may be
// such a commit, taken back by the promotion; only Guard's locking read,
// and what a Lease trusts, waits for the standby. A release, which does
// not wait for its flush or for the standby, can likewise be taken back —
// by a promotion, or by a crash of a single server: a name read as free
// (or a waiter woken by the release's notification) may show the old
// acquisition held again, until its expiry. A waiter's next try sees that
// and waits on.
//
// With an asynchronous standby, the
// commits it had not received are lost, and the new primary's counter is
// behind the tokens already handed out.
//
// The rule of detection: a Store remembers the highest token it has seen
// per name — its acquisitions, the holder's token in a [HeldError], tokens
// read by [Store.Get], set by [Store.Break], and those of the leases it
// released (resumed ones too) — for as long as it lives.
// An acquisition the server grants with a token no higher than the highest
// the Store had seen before it sent the statement is refused: TryAcquire
// and Acquire return a [*RegressionError] (errors.Is [ErrTokenRegressed]),
// and the Store releases the acquisition with the row's counter raised to
// that highest token, so the next acquisition, by any client, gets a token
// above every token this Store has seen (TestFailoverAsyncLag,
// TestTokenRegressionDetected). A leader election (package leader) retries
// its campaign after such a refusal, so terms keep growing
// (TestFailoverAsyncStandbyTermsGrow).
//
// What detection cannot catch: a token that this Store never saw — handed
// out to another process, or before this Store was made (a restarted
// process remembers nothing) — may be handed out again, silently; so may a
// token higher than every one this Store saw. Only what protects the
// resource can catch those: a resource that remembers the highest token it
// accepted refuses the reissued one. Detection never refuses a correct
// server's token: a token seen before the statement was sent had committed
// before it ran, so a correct server always hands out a higher one.
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
// The Guard's row lock also holds back the holder's own renewals until the
// guarded transaction ends, and renewals take a connection from the same
// pool as the application. So a guarded transaction must end well within
// the trust window: it is safe to last up to TTL × (1 − RenewFraction) −
// SafetyMargin (it may start just before a renewal is due) — 0.57 × TTL
// with the defaults, 17 s for a 30 s lease — and a transaction longer than
// TTL − SafetyMargin (0.9 × TTL) always costs the lease it guards. Leave
// the pool a connection for renewals, too: when the application holds
// every connection for longer than that window, the lease is lost.
//
// # Shared leases
//
// [Store.TryAcquireShared] and [Store.AcquireShared] take a reader's hold
// of a name rw, many at once; [Store.TryAcquireExclusive] and
// [Store.AcquireExclusive] a writer's, which excludes readers and other
// writers. Each hold is an ordinary [*Lease] on a row of its own: the
// writer's is rw + "#w", a reader's one of rw's slots rw + "#r.1",
// rw + "#r.2", …, reused: a reader takes a free slot, and a slot's row is
// made only when every lower slot's row exists, so a name has as many
// slot rows as it ever had readers in at once. Renewal, keep-alive, loss
// (Lost, Context: TestSharedReaderLoss), Release, Guard, the rules of
// Unknown outcomes and [WithMaxHold] are the lease's own. A reader's token
// fences nothing against other readers; the writer's fences as any
// lease's (TestSharedWriterFencing). Do not take these rows as plain
// leases, and do not delete them.
//
// Exclusion comes from the order of commits, with no lock held across
// statements: a reader takes its slot, then reads the writer's row; a
// writer takes its row, then reads the slots. Each read is sent after the
// write before it committed, so of a reader and a writer that race at
// least one sees the other: a reader that sees a writer gives its slot
// back, a writer that sees readers waits for them (AcquireExclusive) or
// gives its row back (TryAcquireExclusive). Each try reads before it
// writes, so a try that finds the other side in writes nothing
// (TestSharedReadersAndWriter); only a try that races one writes, then
// gives back what it took (the writer's row's token is then one higher).
// Both judge the other's rows by the server's clock, as leases do: a row
// expired by that clock is one its holder no longer trusts.
//
// Writers are not starved. A writer's row, once taken, is its intent: no
// reader gets in while it is held, and AcquireExclusive waits only for the
// readers already in — woken by each one's release through NOTIFY, or at
// its slot's expiry when its holder vanished — renewing its row meanwhile
// when it has no keep-alive (TestSharedWriterRenewsWhileWaiting). So a
// writer waits at most as long as the longest hold among the readers in
// when it took its row (TestSharedWriterNotStarved: about 0.5 s under a
// stream of readers holding 0.3–0.6 s each, some reader always in); cap
// readers' holds with WithMaxHold to bound it. A reader waits for a
// writer's release as Acquire waits; a writer for another writer too.
//
// A try costs three round trips (read, acquire, read); each read walks the
// slot rows by their primary key, one lookup per slot. Shared leases work
// behind a transaction-mode pooler, as every lease does
// (TestViaTransactionBouncer runs TestSharedReadersAndWriter and
// TestSharedWriterWokenByRelease, waiters polling there): the one
// shared lock of this module that outlives a transaction there
// (advisory's XactRLock lasts one transaction). TestSharedStress checks
// exclusion under load (PGLOCKS_STRESS=1: 10,000 holds by 12 workers in
// three stores).
//
// # Long holds
//
// [WithMaxHold] caps one Lease's hold: d after the Lease was made, its
// keep-alive stops, Lost closes and Context is cancelled with a cause
// wrapping [ErrLost] and [ErrMaxHold], and its row is released in the
// background (retried until the server answers, for at most min(TTL,
// 30 s)), so the next acquirer gets the name at once rather than at the
// row's expiry (TestMaxHold). The release is safe: the holder has stopped
// trusting the lease before it is sent. A wedged holder — its work stuck,
// its keep-alive renewing — so keeps a name for d at most; work that does
// not watch its Context may go on after that, so fence what it writes
// ([Lease.Guard], [Lease.Token]). [Store.Do] with WithMaxHold cancels fn's
// context and returns an error wrapping ErrMaxHold (TestMaxHoldDo); an
// Observer sees the end as pglocks.ReasonMaxHold.
//
// # What this does not guarantee
//
//   - A paused process cannot be stopped. A holder frozen by a GC pause, a
//     stopped VM or a slow disk may resume after its lease has expired and
//     act on it: nothing in a lease can prevent that. Fencing can — guarded
//     transactions and token checks refuse the stale holder's writes.
//     Unfenced side effects (an email, a call to an API that ignores the
//     token) may happen twice.
//   - Tokens are as durable as the database. Acquisitions, renewals and
//     breaks are flushed locally (and to synchronous standbys when the
//     session asks for a remote level); releases are not waited for (see
//     Durability). After a failover to an asynchronous replica, recently
//     committed acquisitions can be lost and a token handed out again; a
//     Store detects that only for tokens it has seen itself (see Failover).
//     Use synchronous replication (or fence with something that survives
//     failover) if that matters.
//   - The local trust deadline assumes the client's monotonic clock does not
//     run much slower than the server's; the safety margin absorbs modest
//     drift, not a stopped clock.
//   - Acquire is fair only within one Store: its Acquire calls of a name
//     queue first come, first served, and only the head of the queue tries
//     the server and is woken by a release (so a release wakes one waiter
//     per store, not all: TestAcquireQueuesFIFO, BenchmarkHotAcquire).
//     Across stores the heads race for the row, and a TryAcquire, which
//     never queues, may win.
//   - Prompt loss needs the store's listening connection: a Break or
//     takeover while it reconnects is noticed by a kept-alive lease within
//     Config.CheckInterval, by any lease at its trust deadline.
//   - An attempt cleaned up in the background was never the caller's: do
//     not build a Handle for it from [Store.Get] and resume it.
//
// # Waiting
//
// A store opens one extra connection, on the first Acquire that has to
// wait or the first lease it holds, and keeps it until Close: it LISTENs
// on Config.Channel (to wake waiters, and to hear of its leases' loss) and,
// while
// a name has waiters, holds a shared session advisory lock on the bigint
// key KeyOf("pglocks.lease:" + channel + ":" + name) (see package pglocks).
// A release notifies only when it cannot take that key itself, so releases
// that nobody waits for send no NOTIFY, whose commit-time lock would
// otherwise serialize busy releasers. Do not take these keys elsewhere: at
// worst a waiter then wakes at the holder's expiry instead of at once.
// The connection's idle_session_timeout is 10 s (PostgreSQL 14 and later)
// and it sends a round trip every 5 s whatever arrives, so that a store
// cut off from the network is ended by the server, with its interest locks
// (and, behind a session-mode pooler, which would keep it for hours, its
// pooler slot) within about 10 s (TestPartitionedListenerEnds).
//
// # Behind a pooler
//
// Every statement of a store stands alone, so leases work behind PgBouncer
// in transaction pooling mode, in every pgx exec mode: on its first
// statement a store whose pool caches prepared statements or describes
// them separately (QueryExecModeCacheStatement, pgx's default, and
// DescribeExec) checks whether its connections are behind a pooler (the
// startup process id is not the backend's); then its statements run in
// QueryExecModeExec, and Guard's in the caller's transaction too
// (TestViaTransactionBouncer runs the behaviour tests through a real
// PgBouncer in each of the five modes).
//
// The listener opens its connection the way the pool does (hooks
// included). Behind a pooler it probes with a second connection whether the
// pooler keeps each client on one server session; behind transaction
// pooling, where a LISTEN and the interest locks would stay on whichever
// server session ran them, it takes neither, and waiting Acquire calls
// poll every 200ms ± 50% instead of waiting for a NOTIFY
// (TestAcquirePollsBehindTransactionPooling). Loss of a lease is then
// noticed by the keep-alive's check or the trust deadline, not announced.
// One protection is weaker there: an acquisition interrupted mid-statement
// is cleaned up by its attempt id, but the server backend that ran it
// cannot be ended first (the connection's pid is the pooler's), so a
// statement that commits after its cleanup leaves the name held by nobody
// until its TTL — never held twice.
package lease
