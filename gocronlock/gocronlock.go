// Package gocronlock makes a [schedule.Runner] a gocron v2 Locker
// (github.com/go-co-op/gocron/v2): every replica runs the same gocron
// scheduler, and each run of a job happens on one replica only — once per
// slot of the server's clock, not per tick of the replicas' own clocks.
//
//	runner, _ := schedule.New(schedule.Config{Store: store, Pool: pool})
//	locker, _ := gocronlock.New(runner, schedule.Policy{Period: time.Minute})
//	s, _ := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
//	s.NewJob(gocron.CronJob("*/5 * * * *", false), gocron.NewTask(report), gocron.WithName("report"))
//
// gocron asks Lock(ctx, job name) before each run and unlocks after it.
// Lock starts a run of the job named by gocron's job name. Set it with
// gocron.WithName: the default is the Go function's name, so two jobs
// built on one function (two NewJob calls with the same task, different
// schedules or parameters) would share one job and one slot, and only
// one of them would run per slot. The run is for the slot of that moment
// by the server's clock, with the Locker's policy ([schedule.Job.Start]):
// Policy.Period is the slot's granularity, more than twice
// Policy.Tolerance (the skew the replicas' timers may have), and
//   - for a cron job (gocron.CronJob, DailyJob, …), whose ticks fall at the
//     same times on every replica, at most the job's interval;
//   - for an interval job (gocron.DurationJob and the like), equal to its
//     interval: each replica's timer starts when its scheduler does, so
//     the replicas tick out of phase, and a shorter Period would give
//     their ticks different slots and run the job once per replica.
//
// A replica whose Lock finds the slot taken gets
// the [*schedule.TakenError], and gocron skips that run there (its
// AfterLockError listener sees the error). Unlock records the run as
// [schedule.Finished] — gocron does not tell a Locker how the job went —
// and releases the job's lease. gocron's own clock, which tests replace
// with a fake one (gocron.WithClock), plays no part in the slot.
//
// What the schedule package does not guarantee holds here too (see its
// doc): a slot no replica asks for within its window is not run; a run
// that crashed is not run again by default (Policy.RerunCrashed). gocron
// gives the job no handle on its run, so the run's lease cannot fence the
// job's writes: a job that must fence them should use package schedule
// directly inside its task.
package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/go-co-op/gocron/v2"
	"github.com/pglocks/pglocks/schedule"
)

// Locker is a gocron.Locker running each job once per slot. It is safe for
// concurrent use. Make it with [New].
type Locker struct {
	runner *schedule.Runner
	policy schedule.Policy

	mu   sync.Mutex
	jobs map[string]*schedule.Job
}

var _ gocron.Locker = (*Locker)(nil)

// New returns a Locker that starts runs through runner with policy, which
// needs a Period (or AtLeast). A nil runner or an invalid policy is an
// error naming it.
func New(runner *schedule.Runner, policy schedule.Policy) (*Locker, error) {
	if runner == nil {
		return nil, fmt.Errorf("gocronlock: %w: runner is nil (make one with schedule.New)", schedule.ErrInvalid)
	}
	if policy.Period == 0 && policy.AtLeast == 0 {
		return nil, fmt.Errorf("gocronlock: %w: Policy.Period (the slot's granularity) is zero, and so is AtLeast", schedule.ErrInvalid)
	}
	if _, err := runner.Job("gocronlock", policy); err != nil { // the policy's checks, runner's included
		return nil, fmt.Errorf("gocronlock: %w", err)
	}
	return &Locker{runner: runner, policy: policy, jobs: map[string]*schedule.Job{}}, nil
}

// Lock starts a run of job key for the current slot. It returns a *Lock,
// or the error of [schedule.Job.Start]: a [*schedule.TakenError] when
// another replica has the slot.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	if l == nil || l.runner == nil {
		return nil, errors.New("gocronlock: nil or zero Locker (make one with gocronlock.New)")
	}
	l.mu.Lock()
	job, ok := l.jobs[key]
	if !ok {
		var err error
		if job, err = l.runner.Job(key, l.policy); err != nil {
			l.mu.Unlock()
			return nil, fmt.Errorf("gocronlock: %w", err)
		}
		l.jobs[key] = job
	}
	l.mu.Unlock()
	run, err := job.Start(ctx)
	if err != nil {
		return nil, err
	}
	return &Lock{run: run}, nil
}

// Lock is one run of a job, started by [Locker.Lock].
type Lock struct {
	run *schedule.Run
}

// Run returns the run (nil for a nil Lock).
func (k *Lock) Run() *schedule.Run {
	if k == nil {
		return nil
	}
	return k.run
}

// Unlock ends the run as [schedule.Finished] and releases the job: see
// [schedule.Run.Finish], which does not give up on ctx's cancellation.
func (k *Lock) Unlock(ctx context.Context) error {
	if k == nil || k.run == nil {
		return errors.New("gocronlock: nil or zero Lock")
	}
	_, err := k.run.Finish(ctx)
	return err
}
