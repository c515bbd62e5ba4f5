// Package shard spreads a group's N named shards over its live members —
// replicas of a service — so that each shard has at most one owner, shares
// are balanced, and a member joining or leaving moves at most ⌈N/M⌉
// shards.
// It is built on package lease: a member's liveness is a lease, and each
// shard's ownership is a lease with a fencing token of its own.
//
// # Model
//
// A [Member] of group G with identity I holds the kept-alive lease
// "G#m:I" (its member row) for as long as it runs; the group's members
// are the live member rows. Each shard lease records, in its metadata,
// the identity of the member holding it and the token of that member's
// row. Every PollInterval a member reads the group's rows — the member
// rows and the shard leases, in one query — and computes, by itself,
// which shards are its share ([Member.Target]); no coordinator, no extra
// table. At rest — the last such read found every shard with its target
// owner, and this member holds its share — it reads only the member rows,
// one query as cheap as before the shards were counted, and the whole
// group again when those changed (a member joined, left, died or joined
// again), when its shard set changed, or, as a safety net, 10 TTLs after
// its last whole read. For
// each shard of its share a member acquires the lease "G#s:<shard>" with
// keep-alive — waiting, if
// another member holds it, for that member's release, which wakes it at
// once through NOTIFY, or for the row's expiry — and runs the function
// given to [Member.Run] with a [Shard]: the shard's name, its token, Guard
// and a Context cancelled when the term ends. A shard that leaves its
// share is given up: its Context is cancelled with cause [ErrReassigned],
// and once the function has returned the lease is released. When the
// member leaves, every shard's Context ends with cause [ErrLeft]; when a
// term's lease is lost, with the lease's cause. ErrReassigned and ErrLeft
// wrap context.Canceled. Group names contain no '#', so that no group's
// lease names are another's.
//
// All of a member's leases — member row and shards — live in its
// [lease.Store] and are renewed by the store's one batched keep-alive:
// one statement per renewal round for the process, however many shards
// (see the figures in docs/shards.md). Give the Store a pool of its own,
// apart from the one the shards' work uses: its reads, acquisitions and
// renewals then never wait for a connection that work holds (they still
// share the server's CPU and locks).
//
// # Assignment
//
// The assignment is sticky: a function of the shard set, the member set
// and who owns each shard now, so that only what must move moves. A
// shard counts as owned when its lease is held by a live member's
// current membership; a shard that is free, or held by a member that
// died or left, is unowned. With N shards and M members, every member has
// room for ⌊N/M⌋ shards and N mod M of them for one more: first those
// that own more than ⌊N/M⌋ already (counting the free shards they owned
// last), then the others by a fixed pseudo-random order of their
// identities. Each member keeps as many of its shards as it has room for
// (the heaviest by rendezvous weight, a pseudo-random weight of each
// (shard, member) pair from FNV-1a and SplitMix64), and the shards it
// drops and the unowned ones go to the members with room left: first
// each to the member that last owned it, as this member last read, if
// that member has room (so that a shard whose lease its owner lost goes
// back to that owner, which is taking it again, rather than to another
// member), then the rest by (shard, member) pairs, heaviest first. A
// member forgets the last owner of a shard its reads have found unowned
// for longer than TTL — another member always, itself only when a
// non-member holds the shard's lease: members' memories can differ (one
// read the shard held, another never did), and each could leave a free
// shard to another; past TTL they plan from the shared read, and it is
// taken (TestFreeShardDivergentMemories, TestFreeShardBesideStranger).
// Every member ends with exactly its room, so loads differ by at most one, and
// the target applied is its own target: a settled group stays put
// (TestPlanBalanced).
//
// From a settled group, a member joining takes exactly ⌊N/M⌋ shards (M
// counting it) and no other shard moves: the others give up only their
// excess over their new room; a member leaving or dying has
// exactly its own shards spread over the others (⌊N/M⌋ or ⌈N/M⌉, M
// counting it), and no other shard moves. So a join or a leave moves at
// most ⌈N/M⌉ shards, M the larger member count — the least any balanced
// assignment can promise (a leaver's shards must move; a joiner must get
// ⌊N/M⌋). For N = 100 and M ≤ 11 that is at most 1.10 × N/M, for
// N = 1,000 and M ≤ 10 at most 1.008 × N/M (TestPlanMovement: every
// M, random identities, joins and each possible leaver, from ownerships
// reached through random histories; any N ≥ M).
//
// Members compute their targets from reads taken at different times, and
// act on them — release, acquire — while the others do. The rule is made
// so that this does not add moves: which members have room for one more
// does not change while shards move towards the target, so no member
// takes a shard it must give up again, and no shard goes back and forth
// (TestPlanConverges: members acting on stale reads in random orders,
// joins, leaves and crashes whose rows end in any order: every event
// settles to loads within one, moving exactly the shards above, each by
// one acquisition). A shard the target moves from a live member is
// acquired by its new owner as soon as the old one releases it (NOTIFY
// wakes the waiting Acquire): the hand-over waits for both to have read
// the change, up to one PollInterval. A live group moves exactly these
// shards (TestBalanceJoinLeave, TestStress, which count the acquisitions
// from the lease tokens).
//
// # Guarantees, and the tests that hold them
//
//   - Never two trusted owners of a shard: ownership is holding the
//     shard's lease, which one owner at a time holds (package lease). A
//     moving shard is released by its old owner only after its function
//     returned; the new owner's Acquire wakes on the release. A write
//     fenced with [Shard.Guard] commits only while its term holds the
//     shard (TestBalanceJoinLeave, TestMemberDeath: every owner writes
//     guarded rows; the checker finds no write of a superseded token after
//     a newer one).
//   - Balance: once the moves are done and every member has read the
//     group since, max − min ≤ 1 (TestBalanceJoinLeave: N = 100, M = 1..5
//     joining and leaving; TestPlanBalanced, TestPlanConverges).
//   - Movement: from a settled group, a member joining takes exactly
//     ⌊N/M⌋ shards and a member leaving or dying has exactly its own
//     shards moved, each by one acquisition; nothing else moves. Either is
//     at most ⌈N/M⌉, M the larger member count (see Assignment;
//     TestPlanMovement, TestPlanConverges, and live: TestBalanceJoinLeave,
//     TestStress).
//   - A member that leaves (Run's ctx ends) cancels every shard's Context
//     at once (cause ErrLeft), releases its member row, and releases each
//     shard as soon as its function has returned — possibly before the
//     member row; Run returns once all are released. The others take its
//     shards at their next read of the group, within one PollInterval of
//     the releases (TestLeaveCause).
//   - A member that dies (crash, SIGKILL, a pause longer than its trust
//     window) has its shards taken over within TTL + PollInterval, plus
//     the time the others take to read, plan and acquire (a read that
//     fails costs TTL/3 and a PollInterval more): its rows expire at most TTL
//     after their last renewal, the others' next poll after that (within
//     PollInterval) reads the member rows, then the whole group, and
//     acquires its shards, in parallel over the Store's pool. Those
//     statements take milliseconds on an idle server; at load 30–60 on 2
//     cores, with TTL 10 s and PollInterval 1 s, the rows' expiry to the
//     last shard taken was median 1.6 s, worst 5.4 s, the poll's wait
//     included (TestProcChaos, which logs each takeover's breakdown: reads
//     of the group of up to 3 s, plans of up to 1.6 s of a starved CPU) —
//     provided the Store gets connections: give it a pool of
//     its own, or leave its pool connections the application does not
//     take. A Store that shares a pool the application keeps busy waits
//     for it like any other caller (TestTakeoverBusyApplication: none of
//     the shards while the application holds the pool; with one pool
//     between a process's Store and its owners' writes, TestProcChaos's
//     takeovers took up to 18 s against 11 s at load 40–60, every
//     connection busy with writes). TestMemberDeath: 1.6 s with TTL 2 s,
//     PollInterval 100 ms. A paused member's leases
//     end locally before they can expire (lease's trust deadline), so its
//     Contexts are cancelled before anyone else owns its shards; it then
//     joins again. One exception: a member paused inside a guarded
//     transaction keeps that shard's lease row locked, and the takeover
//     of that shard waits for the transaction — until the member resumes
//     or its session ends (TestProcStopMidTransaction); set
//     idle_in_transaction_session_timeout on members' connections to bound it.
//   - Connections killed under a member (pg_terminate_backend) cost
//     nothing: the keep-alive renews on new connections (TestMemberDeath).
//   - A member restarting with the identity of one that crashed waits for
//     the old member row to expire (its time left plus PollInterval,
//     logged at Info; once more if the old holder renewed it meanwhile, as
//     a renewal sent before the crash can commit late) and joins; a row
//     still held after that, renewed by a live holder, or taken by another
//     holder meanwhile, is refused with [ErrIdentityInUse]; a row held by
//     the join's own attempt, cut off by its deadline after it committed,
//     is waited for (TestRestartSameIdentity, TestRestartLateRenewal,
//     TestRestartSlowLink, TestJoinTwice).
//   - Bad input — an empty group, a group with '#', no shards, an empty or
//     duplicate shard name, a second live member with one identity — is a
//     clear error, never a panic (TestBadInput, TestGroupNameHash,
//     TestJoinTwice; internal/nilsafe).
//
// # Unknown outcomes
//
// Every statement is the lease package's, with its rules: an acquire
// whose outcome is unknown is cleaned up by its attempt id and retried;
// a release whose outcome is unknown ends the term at once. A failed read
// of the group changes nothing: the member keeps its shards (their
// leases stay its own) and tries again at the next poll. Each read is
// bounded by TTL/3 and abandoned if the member row is lost meanwhile, so
// a reply that never comes cannot stop the member from noticing the loss
// and joining again (TestListReplyLost); each join statement is bounded
// by TTL.
//
// # What this does not guarantee
//
//   - A paused process cannot be stopped from acting: as for any lease,
//     only fenced writes ([Shard.Guard], or [Shard.Token] checked by the
//     resource) are refused once the shard has moved on.
//   - Members must agree on the shard set; while they disagree (a rolling
//     change of Config.Shards, a [Member.SetShards] not yet made
//     everywhere) some shards may stay unowned or loads unbalanced —
//     never doubly owned.
//   - While members' reads of the group differ (up to one PollInterval
//     after a change), a shard may wait for its new owner: the hand-over
//     takes up to PollInterval, not zero.
//   - The movement bound is for one join or one leave from a settled
//     group. A lost lease — renewals late past the trust deadline, a lease
//     broken by hand — is not a leave: its shard is free, its owner takes
//     it again at once, and the others leave it to that owner, counting it
//     as the owner's while they remember it as the last owner; only a
//     member that has not read the group since the shard was last held
//     (one that just joined), or any member once its reads have found the
//     shard free for longer than TTL, may take it instead (TestPlanConverges loses
//     leases on the way and logs how many shards ended elsewhere: none in
//     its runs). A member whose row
//     is lost leaves and joins again: its shards spread over the others,
//     then it takes ⌊N/M⌋ anew. A group starting from nothing, its
//     members not yet seeing each other, may move shards more than once
//     until it settles.
//   - Every member of a group must run this assignment rule: a shard
//     lease without its holder in the metadata (taken by an earlier
//     version of this package, which assigned by the member set alone)
//     counts as unowned, so a group that mixes versions during an upgrade
//     stays safe but may not settle until all members run one version.
//   - [Member.Owned] is a snapshot for inspection, not a trust signal: a
//     shard may be lost the moment after. Trust a term's Context and
//     fenced writes only.
//   - A panic in the function given to Run is not recovered: it ends the
//     process, as any goroutine's panic does, and the rows expire.
//   - The group is read by polling Store.ListPrefix, one query per member
//     per PollInterval (two in the poll that finds the member rows
//     changed); there is no push notification of joins. At rest it reads
//     the member rows ("<Group>#m:", M rows); while shards move, the
//     whole group ("<Group>#", M + N rows, 100 to 400 times the server
//     time of the member rows for 1,000 shards: TestRestCost). Either
//     scans the whole lease table. A shard whose owner fails to take it again after
//     losing its lease (and keeps its member row) is left to that owner,
//     which keeps trying, until the others' reads have found it free for
//     longer than TTL; a member at rest does not read it until its next
//     whole read (at most 10 TTLs later).
package shard
