// Package leader elects one leader among candidates — replicas of a service,
// or one per tenant or shard — on PostgreSQL, with sub-second failover after
// a crash and fenced terms.
//
// An [Elector] combines two primitives. A session advisory lock (package
// advisory) gates the campaign: PostgreSQL frees it the moment a crashed
// leader's connection closes, so the next candidate is elected at once
// instead of a lease later. A lease (package lease) carries the term — its
// fencing token, which only grows — the leader's identity and expiry, is
// renewed by the Store's batched keep-alive while the leader holds it and
// read by everyone, and keeps the election safe
// when a leader is only cut off. Behind a pooler in transaction mode, where
// session locks cannot work, the election runs on the lease alone
// (Config.Mode; see "Lease-only campaign" below).
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
//	│    ┌───────────┐  work cancelled; lease released, lock      │ trust deadline passed,
//	└────│ stepping  │◀─ unlocked (at once when lost, else once ───┘ Resign, work returned,
//	     │   down    │   the work returned); OnDemoted               Run's ctx ended, Close
//	     └───────────┘  (after Resign or work returned: sit out RetryInterval)
//
// # Campaign
//
// A candidate (in session mode, the default where session locks work)
// waits for the advisory lock on [pglocks.KeyOf]("pglocks.leader:"
// + name): a release wakes it through LISTEN/NOTIFY, a crashed holder's lock
// is picked up by the advisory package's short backoff. Holding the lock, it
// acquires the lease "pglocks.leader:" + name. If the previous leader still
// holds the lease — it crashed, or its session was terminated — the
// candidate waits until the holder's horizon has passed since it took the
// lock (a release ends the wait at once), then breaks the lease and takes
// it over.
//
// # Lease-only campaign
//
// In [ModeLeaseOnly] — chosen by Config.Mode, or by [ModeAuto] (the
// default) when the Locker refuses session locks with
// [advisory.ErrTransactionPooling], which it logs once at Warn and
// [Elector.State] shows as Mode — a candidate takes no advisory lock: it
// acquires the lease "pglocks.leader:" + name when it is free, released or
// expired (the server decides, by its clock), renews it, trusts it until
// the lease's own trust deadline and steps down when it is lost. A crashed
// leader is replaced once its lease expires, within TTL of its last renewal
// plus a poll (at most about 300ms behind transaction pooling, where the
// lease Store polls); a leader that resigns or stops releases the lease and
// is replaced within that poll — at once where NOTIFY works.
//
// Candidates in both modes may share an election (a rolling deploy, or one
// replica behind the pooler). A lease-only leader records in the lease row
// that it is one, and no session and no horizon: a session-mode candidate,
// which gets the advisory lock at once since the lease-only leader holds
// none, waits for that lease to be released or to expire (as for a holder
// that records no horizon), never breaks it early and terminates no
// backend for it. A lease-only candidate takes a
// session-mode leader's lease only once it is released or expired, like
// any lease. A lease-only leader's term is as safe as a lease (see package
// lease): it holds no session whose loss could end it sooner.
//
// Upgrade every session-mode candidate to a version with lease-only mode
// (one that knows Config.Mode) before any lease-only candidate joins the
// election — ModeAuto falls back to lease-only behind transaction
// pooling. An older session-mode taker breaks whoever holds the lease
// once it has waited out the holder it first read; if that lease expired
// during the wait and a lease-only candidate took it, the older taker
// breaks a live term: two leaders, until the lease-only one's next
// renewal fails. Between candidates of this version no such break exists.
//
// # Why that is safe: the holder's horizon
//
// A leader trusts its advisory session only until its Grace after the send
// time of the last round trip that succeeded on it, and its lease only
// until the send time of its last successful renewal + TTL − margin, both
// on the monotonic clock: once either deadline passes, the leader's work
// context is cancelled and it steps down. A session that answered at time s
// held the lock at s; the lock was freed later, so the new candidate took
// it after s. The holder stops trusting at s + its Grace; so the taker
// waits, after taking the lock, for the holder's Grace — not its own.
//
// Candidates need not share settings (a rolling deploy changes them): every
// leader records its own horizon in the lease row's metadata as it uses it
// — Grace, the Locker's PingInterval, TTL and the Store's safety margin —
// and a taker waits max(its own Grace, the Grace recorded by the holder).
// Only Grace enters the wait: the ping interval is inside it (Grace must
// exceed 1.5 × PingInterval), and the lease's TTL and margin are honoured
// by the server, which does not let the lease go before its expiry. A
// holder that recorded no horizon (a lease-only leader, or a version
// before horizons were recorded) is waited for until its lease expires or
// is released. The taker
// breaks only the term whose horizon it waited for — the row must still
// show that owner and token — so a lease-only candidate that took the
// lease meanwhile, once it expired, keeps it.
//
// Every comparison of a deadline is made on the clock that produced it:
// lease deadlines on the Store's Config.Now, session deadlines on time.Now;
// [Term.TrustedUntil] carries the lease's over to time.Now, rounding early.
//
// # A partitioned leader
//
// When a leader is cut off from the database, it stops trusting its session
// Grace after its last successful round trip, and steps down: its work is
// cancelled well before anyone else can lead. The server, though, may keep
// its session — and the advisory lock — for a long time. The advisory
// package sets per-session TCP keepalives and tcp_user_timeout, and on
// PostgreSQL 14 and later an idle_session_timeout that ends a lock session
// whose pings have stopped, so that the server drops such a session within
// about ten seconds by default (the Locker's TCPUserTimeout), directly or
// behind a session-mode pooler. Should it not (older servers behind a
// pooler, other settings), the candidates see the lease expire by
// the server clock while that session still holds the lock: the lease row
// records the leader's session pid, and a candidate terminates exactly that
// session (pg_terminate_backend; Config.NoTerminate turns this off) — in one
// statement, and only if at that moment the row still shows the same owner
// and term, expired, that backend holds this election's lock, and it holds
// no other advisory lock. A session shared with other elections or with the
// application's locks is never terminated: then the election waits for the
// server to drop it — and on PostgreSQL 13 and older a stopped process
// (SIGSTOP, a frozen cgroup, a debugger, `docker pause`) is never dropped,
// since its kernel still answers keepalives: the election then waits until
// the process resumes (and steps down) or dies; on 14 and later its
// sessions end once their pings have stopped for the Locker's
// TCPUserTimeout. Candidates report the wait in State.LastError.
// So give an election that must fail over fast after a partition or a
// stall a Locker of its own (the default when Config.Locker is nil).
// With termination, the election makes progress within TTL + RetryInterval
// of the leader's last renewal, given the privilege to terminate — the same
// role, or membership in pg_signal_backend — and otherwise as soon as the
// server drops the session.
//
// # Stepping down
//
// A leader whose term is lost — its session died, its lease was broken or
// taken over, its trust deadline passed or was read as passed by
// Term.TrustedUntil (a lapse is final, even if a late renewal or session
// check would move the deadline on: TestObservedLapseEndsTerm) — steps
// down at once: it releases the lease and unlocks the campaign lock even
// while its work function, told by its context, has not returned yet, so a
// misbehaving work function does not hold up the failover. Run waits for
// the work to return before it campaigns again. A term that ends otherwise (Resign, Run's ctx, Close)
// lets the work return first and then steps down. A term whose lock or
// lease is already known lost, or whose trust deadline passed while the
// process was stalled, does not start its work.
//
// # Unknown outcomes
//
// A statement whose reply never came may have run. For an election that is
// harmless in every case, because a leader's trust never rests on a reply
// it did not get: a renewal with an unknown outcome — the keep-alive's batch
// or a renewal of one lease — extends nothing locally (the trust deadline
// moves only on a renewal answered); a step-down's
// release or unlock with an unknown outcome comes after the work was
// cancelled, and at worst the lease expires at TTL or the lock goes with its
// session; an acquisition with an unknown outcome is settled by the lease
// package, and a term begins only on an answered one; a terminate with an
// unknown outcome ended, at most, a stale session the conditions allowed.
//
// A leader's own calls about its candidacy — taking its candidate row,
// reading a request of its term, refusing one — run on a goroutine of
// their own, each bounded by RetryInterval + 5s, never in the loop that
// watches the term: whatever their outcome, and however long they wait
// (an exhausted pool, a partition, a row lock), the loss of the advisory
// session or the lease ends the work within Grace
// (TestRequestDoesNotBlockWatch, TestWatchNotBlockedTakingCandidateRow).
// An unknown outcome of the read of a request is no request: the leader
// leads on and the requester waits until its ctx ends; of a refusal's
// break of the request row, the requester may wait likewise; of a take of
// the candidate row, the row is retaken with backoff (and an acquisition
// that may have run is cleaned up by package lease). None of them decides
// who leads, only whether a request is heard. A requester's own deletion of
// its request row, and a stopping candidate's of its candidate row
// ([lease.Store.Forget]), may or may not run: a row left behind is swept a
// day after it expired. A campaign's calls while it holds the lock (the
// term's try and read, a hand-over reservation's read, the break of an
// outwaited term) are bounded likewise (the term's try by the longer of
// that and TTL, as a slow synchronous commit needs): on a connection gone
// silent the campaign fails, unlocks and is retried
// (TestCampaignOnSilentConn). A take of the candidate row, once sent, is
// not cut short by the end of the wait that sent it
// (TestCampaignEndKeepsRowTry).
//
// # Errors and health
//
// A campaign that cannot succeed — the lease table is missing, a privilege
// or the password is wrong, the server is read-only — makes [Elector.Run]
// return the cause at once (the lease package's errors say what cures
// it). Other failures are retried with capped, jittered backoff and
// logged, which reaches slog.Default() unless Config.Logger says
// otherwise: a candidate that cannot reach the database says so once at
// Warn, with the cause, logs the later failures at Debug, and says at
// Warn when it reaches the database again (TestDefaultLoggerWarns,
// TestUnreachableWarnsOnce). If Run's ctx ends before any campaign of
// that Run reached the database, Run returns the last failure rather than
// nil (TestRunSaysWhyItNeverCampaigned); a campaign whose tries the server
// answered — a follower waiting behind a live leader — has reached it,
// even if every read of the lease row failed
// (TestFollowerBehindLeaderStopsCleanly).
// [Elector.State] reports whether the candidate runs and leads, until
// when its term is trusted, and the last error and when, for health
// checks.
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
// forward requests to the leader. Observe's LISTEN connection has
// idle_session_timeout = 10 s (PostgreSQL 14 and later) and sends a round
// trip every 5 s, so that a follower cut off from the network, even
// behind a session-mode pooler, is ended by the server within about 10 s
// (TestPartitionedObserveEnds). Hooks (OnElected, OnDemoted, OnNewLeader)
// run on a goroutine of their own and never hold up the election.
//
// # Behind a pooler
//
// Through a pooler in session mode everything works as over a direct
// connection (TestViaSessionBouncer runs the behaviour tests through a real
// PgBouncer), a partitioned leader's session included on PostgreSQL 14
// and later: cut off from PgBouncer, a leader steps down after Grace and
// the server ends its lock session once its pings stop, so that a
// candidate that may not terminate it is elected about 10 s after the cut
// with the Locker's defaults (TestSessionPoolerPartitionedLeader; before
// the fix, never). Behind a pooler in transaction mode the campaign's
// session lock cannot be held: the Locker refuses it, and in [ModeAuto] the
// elector campaigns on the lease alone (TestLeaseOnlyBehindTransactionPooling:
// elected, fenced, and taken over after a resignation, a Close or a crash
// within TTL + RetryInterval); in [ModeSession] Run returns
// [advisory.ErrTransactionPooling] at once (TestRunRefusedBehindTransactionPooling).
// For a failover after a crash faster than TTL, give the Locker a pool
// that reaches PostgreSQL directly or through a session-mode pooler.
// [Elector.Observe] and [Elector.Leader] work behind transaction pooling:
// Observe finds by a probe that LISTEN cannot work there, logs it once and
// polls every RetryInterval (TestObservePollsBehindTransactionPooling).
//
// # Candidates, hand-over and a leader's value
//
// While its Run is under way, every Elector holds a candidate row: a lease
// named "pglocks.leader:" + name + "#c:" + Identity, kept alive by its
// Store's batched keep-alive, with its Value, taken once a campaign step
// has reached the database (within about RetryInterval of Run starting).
// [Candidates] (or
// [Elector.Candidates]) lists the live ones, by the server clock, from any
// process; a candidate that stops releases its row, and one that dies
// disappears once its row expires, within TTL of its last renewal. Two
// electors with one Identity: the second is not listed (logged at Warn).
// A leader whose candidate row is lost and cannot be taken again retries
// with backoff up to TTL, and cannot be asked anything meanwhile
// (TestCandidateRowLostDoesNotSpin). A candidate that stops deletes its
// row, and a requester its request's row once answered
// ([lease.Store.Forget]: their tokens fence nothing); each elector deletes,
// about once an hour, its election's candidate and request rows that
// expired more than a day ago (a candidate that died). Deleting needs the
// DELETE privilege on the lease table: without it the rows stay, skipped
// by Candidates, and the table grows by one row per Identity ever used —
// give stable identities (a pod name) where DELETE cannot be granted.
// [Candidates] reads the whole table (see [lease.Store.ListPrefix]).
// Election names may not hold "#c:" or "#req:", the marks of these rows
// (see Config.Name); a request breaks a row only if its metadata names
// the election and the leader's Identity.
//
// [Elector.HandOver] hands the term to a named live candidate (or any
// other): the work is cancelled with [ErrHandedOver]; once it has returned
// the leader records the target in its lease row ([lease.Lease.SetMetadata])
// and steps down as after Resign — release, unlock, notify. A candidate
// that gets the advisory lock next reads the row: if the released term
// names another target, it unlocks and leaves the term to it for 2 ×
// RetryInterval from when it first saw that, so the target — woken by the
// release — takes the next term at once, with no Grace or TTL to wait out
// (measured: TestHandOverGap). Terms stay fenced: the next term's number is
// higher, and the old term's Guard fails once its lease is released, before
// the target can take it. A target that dies during the hand-over costs at
// most that window (TestHandOverTargetKilled). The reservation only decides
// who leads next, never whether two lead: an unknown outcome of its write
// leaves, at worst, a plain resignation or a short wait. Config.HandOverOnClose
// hands over when Run's ctx ends or on Close (SIGTERM in a rolling deploy),
// to the live candidate that joined last — in a rolling deploy, a new pod,
// not an old one about to be stopped. In ModeLeaseOnly no target is
// recorded — lease-only candidates do not yield — so a hand-over is a
// resignation: any waiting candidate may win. In a rolling deploy from a
// version without hand-over, the old candidates do not yield either: a
// hand-over may go to one of them, as a resignation would, until all run
// this version.
//
// Another process asks the leader to resign or hand over with
// [RequestResign] or [RequestHandOver] (pglocks leader resign|handover): it
// records the request in a lease row "…#req:" + term and breaks the
// leader's candidate row, which the leader's Store hears of at once; the
// leader reads the request of its own term only, so a stale request never
// moves a later leader. The break is a signal, not a failure: the leader
// logs the request at Info and nothing at Warn (its Store logs the loss
// of a candidate row at Debug), while a candidate row lost for any other
// reason — broken or deleted by someone else, renewals that failed — is
// logged at Warn by the elector as soon as the loss is seen, even if Run
// ends before the row is taken again (TestRequestLogsNoWarning,
// TestLostCandidateRowWarns, TestOperatorBreakOfCandidateRowWarns). A leader that
// refuses a hand-over (its target is no longer a live candidate) breaks
// the request's row, and the requester
// returns an error wrapping [ErrNoCandidate] at once
// (TestRefusedHandOverIsReported). A second request for a term while one
// is under way joins it if it asks the same, and is refused with an error
// saying so otherwise.
//
// A leader publishes Config.Value with its term ([Leader].Value), at most
// [MaxValueLen] bytes; [Term.Proclaim] changes it during the term in one
// statement scoped to the term, and [Elector.Observe] delivers the change.
// Proclaim's statement waits for an open [Term.Guard] transaction of the
// term (its FOR SHARE lock on the lease row): do not proclaim from inside
// one.
//
// # Renewals
//
// A term's lease is kept alive by its Store ([lease.WithKeepAlive]): the
// Store renews all its kept-alive leases — every election's term and
// candidate row — in one statement (one commit) per round, and each lease
// on its own when the batch did not renew its row, which finds it gone
// (lost at once) or waits out a Guard. The elector sends no renewal of its
// own: it watches the lease, whose loss — its row gone, broken or taken
// over, or its trust deadline passed without a confirmed renewal — ends the
// term as described under Stepping down. A lease whose last confirmed
// renewal is more than two renewal intervals old is reported in
// State.LastError and, once per run, at Warn; the Store logs the failed
// renewals themselves. The cadence is the Store's: TTL × its RenewFraction,
// which is Config.RenewInterval for a Store the elector makes itself and
// overrides it for a Store given in Config.Store (see Config.RenewInterval).
// Elections that share a Store and a TTL fall into step, so a thousand of
// them cost about one renewal statement per renewal interval
// (TestManyElectionsRenewBatched: 1,000 elections at rest, TTL 3 s, 1.05
// renewal statements/s, against 995/s when each leader renewed its own;
// TestBatchedTermLostAlone: a term whose row was deleted by hand is lost
// alone, with lease.ErrNotHeld, and the others renew on).
//
// # Many elections
//
// Elections share one advisory Locker (a few sessions hold every election's
// lock) and one lease Store: a thousand elections in one process do not need
// a thousand connections, and their terms are renewed together (see
// Renewals).
//
// # What is guaranteed, and what is not
//
//   - At most one candidate trusts a term at any instant, provided the
//     candidates' monotonic clocks run at about the server's rate (the lease
//     safety margin absorbs modest drift), whatever Grace, PingInterval and
//     TTL each candidate uses. Terms strictly increase, across crashes,
//     takeovers and server restarts (as durable as the lease table's
//     commits). This holds in elections mixing session-mode and lease-only
//     candidates too (TestMixedModesNoOverlap), if every session-mode
//     candidate knows lease-only mode (see Lease-only campaign).
//   - A crashed or killed leader is replaced within about the longer of its
//     Grace and the taker's (default three advisory ping intervals) plus a
//     few round trips; a terminated session likewise, or sooner when the
//     leader notices and releases; a resigning leader within a few round
//     trips; a partitioned leader within TTL + RetryInterval (see above).
//     A lease-only leader that crashes or is partitioned is replaced
//     within TTL of its last renewal plus a poll, one that resigns within
//     a poll.
//   - A work function that ignores its context keeps running after its term
//     ended: the election moves on without it, but nothing stops its
//     unfenced side effects.
//   - A paused process — a long GC pause, SIGSTOP, a frozen VM — cannot be
//     stopped from acting when it resumes, before its own timers run. Only
//     fencing stops its writes: guard them with the term. Unfenced side
//     effects may happen twice.
//   - Terms are as durable as the database. On a failover every advisory
//     session is gone and a new election follows on the new primary, which
//     a pool with a multi-host target_session_attrs=read-write DSN reaches
//     (TestFailoverSyncStandby: 5 promotions by default, 20 with LEADER_TRIALS=20, a higher term each time).
//     After a failover to an asynchronous replica that lacked recent
//     commits, the lease row's counter is behind: a candidate's Store
//     refuses a term no higher than one it has seen (a leader's own terms,
//     and those read while waiting), and the campaign goes on above it
//     (TestFailoverAsyncStandbyTermsGrow); a term no candidate saw may be
//     handed out again. An Elector pointed at a standby fails at once with
//     advisory.ErrStandby (TestStandbyRefused). A resignation's release
//     does not wait for its WAL flush (package lease, Durability): a server
//     crash right after it may bring the resigned term back as the row's
//     holder until its TTL, so observers (Observe, OnNewLeader) may see
//     that term again, and the next leader may wait for its TTL; nobody
//     leads in that term again.
//   - Behind PgBouncer in transaction pooling mode, session advisory locks do
//     not work: the election runs on the lease alone, and a crashed leader
//     is replaced only after its TTL. Point the Locker's pool at PostgreSQL
//     directly for the fast failover.
//   - Elections are not fair: after a leader steps down, any candidate may
//     win.
package leader
