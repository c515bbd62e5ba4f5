// Package gocronleader makes one replica's gocron v2 scheduler
// (github.com/go-co-op/gocron/v2) run the jobs: [Elector] is a
// gocron.Elector backed by a pglocks leader election.
//
//	el, err := leader.New(leader.Config{Name: "jobs", Pool: pool})
//	elector, err := gocronleader.Start(el) // campaigns in the background
//	defer elector.Close(ctx)
//	s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
//
// Every replica runs the same scheduler; gocron asks [Elector.IsLeader]
// before each run, and only the replica that holds a trusted term runs it.
//
// What it guarantees:
//
//   - IsLeader returns nil only while this replica holds a term of the
//     election and trusts it (leader.Elector.Trusted: its TrustedUntil is
//     after now): the
//     leader package's guarantee, that at most one candidate trusts a term
//     at any instant, is IsLeader's. It costs no round trip.
//   - After the leader crashes or its session dies, another replica takes
//     over within the election's failover time (about its Grace, 600 ms by
//     default) and its scheduler runs the next runs; after the leader's
//     [Elector.Close] (a resignation), at once.
//   - An election that cannot run (the lease table is missing, a wrong
//     password) fails [Start] with the cause. One that stops later for
//     such a reason does not restart: IsLeader returns the cause, so runs
//     are skipped, and [Elector.Done] is closed, [Elector.Err] the cause.
//     gocron drops IsLeader's error — it counts the run as skipped and logs
//     nothing — so watch Done (or the leader.Elector's State) to alert or
//     exit.
//
// What it does not guarantee:
//
//   - gocron asks once, before a run: a run that outlasts the term goes on
//     after it, perhaps while the next leader starts the next run. A job
//     that must stop with the term reads it from the leader.Elector
//     (Current) and uses Term.Context, or fences its writes with
//     Term.Guard.
//   - Runs missed while no replica leads (during a failover) are not made
//     up; gocron's scheduling of the next run is local to each replica.
//   - Not once per slot: a new leader may run a job that the old one ran in
//     the same period. For "once per scheduled time", use a gocron Locker.
package gocronleader
