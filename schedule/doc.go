// Package schedule runs a job at most once per slot across replicas, by
// the database server's clock: put the same schedule on every replica, and
// for each slot exactly one of them runs the job, while the others learn
// who ran it without running it.
//
//	runner, err := schedule.New(schedule.Config{Store: store, Pool: pool})
//	job, err := runner.Job("nightly-report", schedule.Policy{Period: 24 * time.Hour})
//	// at every tick of the replica's own timer:
//	rec, err := job.Do(ctx, func(ctx context.Context, run *schedule.Run) error {
//		return report(ctx, run.Lease()) // Guard the job's writes with the lease
//	})
//	var taken *schedule.TakenError
//	if errors.As(err, &taken) {
//		log.Printf("slot %s: run by %s", taken.Slot, taken.By) // not run here
//	}
//
// # Slots
//
// A slot is decided by the server's clock, never the replica's: Start reads
// clock_timestamp() and, for a job with Policy.Period, takes the slot
// floor((t + Tolerance) / Period) — slots aligned to multiples of Period
// since the Unix epoch. A replica whose timer fires up to Tolerance early
// or up to Period − Tolerance late lands on the intended slot, whatever its
// own clock says (TestSkewedReplicas: five replicas whose clocks are ±2 s
// apart, 250 ms slots, 208 slots each run exactly once). A period slot's
// key is its start's [SlotKey] ("2026-11-23T04:00:00.000000Z": one width,
// so keys sort as text). StartSlot takes a slot key from the caller
// instead, such as a cron tick's scheduled time: pass SlotKey(tick), since
// explicit keys are opaque text and one instant spelled two ways would be
// two slots. Policy.AtLeast (ShedLock's lockAtLeastFor) adds, or with no
// Period is, the rule "not more often than every AtLeast": a run starts
// only if no run of the job started within AtLeast, by the server clock.
// With both, keep AtLeast ≤ Period − 2×Tolerance, or slots may be
// skipped: runs of two slots in a row start that close together when one
// replica ticks Tolerance late and the next Tolerance early.
//
// # Model
//
// Each job has one lease (package lease), named [LeasePrefix] + job, and a
// run table (default public.pglocks_runs, see [SchemaSQL]) that keeps its
// last runs: slot, owner, token, start, end, outcome. A Start
//  1. reads the server's clock and the slot's run, if any, in one
//     statement: a slot already run is reported at once as a
//     [*TakenError] carrying that run's [Record];
//  2. takes the job's lease (lease.Store.TryAcquire; renewed in the
//     background, or for Policy.AtMost unrenewed). Its holder starting the
//     same slot makes the slot taken; the holder of another slot's run is
//     waited for (lease.Store.Acquire) until the slot's window closes: then
//     the slot is reported taken if another waiter ran it, else [ErrBusy]
//     (TestBusyThenTaken, TestBusy);
//  3. marks the run, in a transaction guarded by the lease
//     (lease.Lease.Guard): the slot is checked again and, if free — and,
//     for a period slot, if its window is still open by the server clock
//     and no later slot has run ([ErrWindowClosed] otherwise: a replica
//     that stalled before its acquire, TestStalledStart) — a row "running"
//     with the lease's token is inserted (older rows still running are
//     marked crashed, and rows beyond Config.History pruned). Only the
//     lease's holder can commit it, so no two runs of a slot are marked
//     (TestSlotOnce: 20 Starts of one slot, one run). The commit is
//     synchronous whatever the session's synchronous_commit, and so is
//     End's: a crash of the server loses neither (TestRunSurvivesCrash);
//
// and the Run's End records how it ended, then releases the lease. A
// replica that finds the slot taken gets a [*TakenError] whose Record says
// who has it: owner, token, host, start, end and outcome (TestSlotOnce,
// TestFailedRunTakesSlot). The winner's Start costs six round trips (the
// read, the acquire, and begin, guard, mark and commit) and End two (record
// and release); a taken slot costs one read once its run has ended, two
// while it runs (the read and the lease's), four while another replica is
// starting it (TestRoundTrips). The
// lease is per job, not per slot: its token only grows across the job's
// runs, so a resource that refuses lower tokens fences a stale run of any
// earlier slot, and the lease table gains one row per job, not one per
// slot. The slot's row in the run table is what outlives the run.
//
// # Crashes
//
// A run whose process dies keeps the job's lease until its TTL (or AtMost)
// runs out; its row says running meanwhile, and [Crashed] after — as
// [Runner.History] and a TakenError report it, and as the next run of the
// job records it. By default a crashed run's slot is not run again: the
// run may have done part or all of its work (TestKilledRun). With
// Policy.RerunCrashed, a Start of that slot after the crashed run's lease
// expired runs it again, and the history shows both runs
// (TestKilledRunRerun).
//
// Crashed means the run's lease ended before its end was recorded, not
// that its process is gone: a run that outlasts Policy.AtMost (whose lease
// is not renewed) or whose renewals fail for longer than its TTL loses
// its lease while it may still be running. Its context is cancelled then;
// a run that ignores it goes on, shown as crashed, and with RerunCrashed
// its slot may be run again while it still runs.
//
// # Unknown outcomes
//
// The lease steps are the lease package's, with its handling of unknown
// outcomes, never a copy: an acquire whose reply never came is cleaned up
// by its attempt id and Start returns its error; a release always ends the
// lease, and is retried in the background when not sent or unknown. What an
// unknown outcome means at each step of a run:
//   - reading the clock and the slot: a read; nothing happened. Start
//     returns the error and may be called again.
//   - taking the lease: see lease.Store.TryAcquire. Nothing was marked;
//     Start returns the error; another replica, or a later Start, may run
//     the slot.
//   - marking the run: only the commit's outcome can be unknown (a failure
//     before it — the Guard's, say — rolls back: nothing marked, and the
//     error says so). The row may have committed. The job is not run and
//     the lease is released; the row, if there, counts as a crashed run —
//     the slot is missed rather than risk a second run (with RerunCrashed
//     another Start may run it).
//   - the run itself: the lease's loss (lease.Lease.Lost, Context) cancels
//     the run's context; End records [Lost].
//   - recording the end: the row may stay running and then counts as
//     crashed; with RerunCrashed, that slot may be run a second time. End
//     returns an error and a Record whose Outcome is [Unknown], not the
//     outcome it meant to write.
//     The lease is released after, whatever the outcome.
//
// # What this does not guarantee
//
//   - A slot is run only if some replica starts it within its window, from
//     Tolerance before its start to Tolerance before its end, and marks
//     its run before the window closes (a few round trips after the read:
//     a Start that reads the slot in the window's last milliseconds gets
//     ErrWindowClosed): a replica whose timer is off by more than
//     Tolerance may land on a neighbouring slot (already run: taken), and
//     a slot no replica starts in time is not run. Replicas whose clocks differ by more than Tolerance should
//     tick more often than once per slot: every extra tick in a slot costs
//     one read.
//   - A Start that finds another replica starting the same slot (holding
//     the job's lease for it) returns a TakenError at once. If that start
//     then fails before it marks the slot — its process dies, its mark
//     fails — the slot runs only if some replica starts it again within its
//     window: like a run that crashed at once.
//   - Runs of one job do not overlap while each holds the job's lease: a
//     run that outlasts its slot keeps the job, and Starts of the next
//     slot wait for it; when it outlasts that slot's window too, the slot
//     is not run (ErrBusy; TestBusy). Once a run's lease ends — AtMost
//     reached, renewals failing for a TTL, an operator's break — the next
//     Start may begin while that run still goes on if it ignores its
//     context: the next slot's run, or with RerunCrashed the same slot's.
//     Only fencing (Run.Lease) keeps the old run's writes out.
//   - A Start that stalls (a paused process, a long GC, a slow network)
//     between its read of the slot and its mark runs the slot only if the
//     slot's window is still open and no later slot has run when it marks:
//     a period slot is never run after its window, nor after a later
//     slot; an explicit slot key has no window.
//   - Policy.AtLeast counts from the start of the last run, by the server
//     clock (TestAtLeast); Policy.AtMost ends a run's lease at AtMost
//     whatever the run does (TestAtMost), and a lost lease's guarded writes
//     fail (TestBrokenRunIsFenced).
//   - Once per slot means once started. A crashed run is not re-run by
//     default, so its work may be incomplete; with RerunCrashed it may be
//     done twice. Fence the job's writes with its lease (Run.Lease) so that
//     a stale run's writes are refused.
//   - The run table remembers Config.History runs per job: an explicit slot
//     key older than the job's last History runs can be run again. Period
//     slots cannot: a Start marks only the slot of its own window, after
//     every earlier one.
//   - The server's clock decides. Stepped back, it brings a slot round
//     again: that slot is found taken while the run table keeps its run.
package schedule
