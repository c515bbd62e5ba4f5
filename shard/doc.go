// Package shard spreads a group's N named shards over its live members —
// replicas of a service — so that each shard has at most one owner, shares
// are balanced, and a member joining or leaving moves about N/M shards.
// It is built on package lease: a member's liveness is a lease, and each
// shard's ownership is a lease with a fencing token of its own.
//
// # Model
//
// A [Member] of group G with identity I holds the kept-alive lease
// "G#m:I" (its member row) for as long as it runs; the group's members
// are the live member rows. Every PollInterval a member reads them
// ([Member.Members]) and computes, by itself, which shards are its share
// ([Member.Target]); no coordinator, no extra table. For each shard of its
// share it acquires the lease "G#s:<shard>" with keep-alive — waiting, if
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
// (see the figures in docs/shards.md).
//
// # Assignment
//
// The assignment is a function of the shard set and the member set alone:
// each (shard, member) pair has a pseudo-random weight (rendezvous
// hashing, FNV-1a and SplitMix64); pairs are taken heaviest first, each
// giving its shard to its member while the member has room, and members
// have room for ⌊N/M⌋ shards, the first N mod M to fill up for one more.
// So with every member seeing the same member set, each shard has one
// target and loads differ by at most one (TestAssignBalanced,
// TestBalanceJoinLeave). When one member joins or leaves, the shards that
// move are the newcomer's or the leaver's share plus a few that shift
// between the others to keep the balance exact. Measured over 20 member
// sets per M (TestAssignMovement, M the larger member count): for
// N = 100 and M ≤ 6, 1.00–1.23 × N/M on average and at worst 1.44 × N/M;
// for N = 100 and M ≤ 11, up to 1.56 on average and 1.98 at worst (the
// fewer shards per member, the more the rounding moves); for N = 1,000
// and M ≤ 10, 1.04–1.18 on average and 1.25 at worst. A live group moves
// exactly what the assignment moves (TestBalanceJoinLeave).
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
//   - Balance: once every member has read the same member set and the
//     moves are done, max − min ≤ 1 (TestBalanceJoinLeave: N = 100,
//     M = 1..5 joining and leaving).
//   - A member that leaves (Run's ctx ends) cancels every shard's Context
//     at once (cause ErrLeft), releases its member row, and releases each
//     shard as soon as its function has returned — possibly before the
//     member row; Run returns once all are released. The others take its
//     shards at their next read of the member list, within one
//     PollInterval of the row's release (TestLeaveCause).
//   - A member that dies (crash, SIGKILL, a pause longer than its trust
//     window) has its shards taken over within TTL + PollInterval: its
//     rows expire at most TTL after their last renewal, and the next read
//     of the member list after that moves its shards (TestMemberDeath:
//     1.6 s with TTL 2 s, PollInterval 100 ms). A paused member's leases
//     end locally before they can expire (lease's trust deadline), so its
//     Contexts are cancelled before anyone else owns its shards; it then
//     joins again.
//   - Connections killed under a member (pg_terminate_backend) cost
//     nothing: the keep-alive renews on new connections (TestMemberDeath).
//   - A member restarting with the identity of one that crashed waits for
//     the old member row to expire (at most its time left plus
//     PollInterval, logged at Info) and joins; a member whose row is
//     still held after that, renewed by a live holder, is refused with
//     [ErrIdentityInUse] (TestRestartSameIdentity, TestJoinTwice).
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
// of the member list changes nothing: the member keeps its shards (their
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
//   - While members' views of the member list differ (up to one
//     PollInterval after a change), a shard may wait for its new owner:
//     the hand-over takes up to PollInterval, not zero.
//   - Movement is about N/M, not exactly N/M (see Assignment).
//   - [Member.Owned] is a snapshot for inspection, not a trust signal: a
//     shard may be lost the moment after. Trust a term's Context and
//     fenced writes only.
//   - A panic in the function given to Run is not recovered: it ends the
//     process, as any goroutine's panic does, and the rows expire.
//   - Membership is read by polling Store.ListPrefix (the group's member
//     rows; the server still scans the lease table), one query per member
//     per PollInterval; there is no push notification of joins. The
//     assignment is computed again only when the member set or the shard
//     set changed.
package shard
