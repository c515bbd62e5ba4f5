package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pglocks/pglocks/lease"
)

// Job is one named job with its policy, made by [Runner.Job]. It is safe
// for concurrent use; every replica makes its own with the same name and
// policy.
type Job struct {
	r      *Runner
	name   string
	lease  string
	policy Policy
	hooks  hooks // tests only: nil funcs in production
}

// hooks are points where a test stalls a Start or injects a fault.
type hooks struct {
	afterPeek  func() // between the read of the slot and the acquire
	beforeMark func() // between the acquire and the mark
	waiting    func() // before a Start waits for another slot's run
}

// usable returns nil for a Job made by Runner.Job.
func (j *Job) usable() error {
	switch {
	case j == nil:
		return errNilJob
	case j.r == nil:
		return errZeroJob
	}
	return nil
}

// Name returns the job's name ("" for a nil Job).
func (j *Job) Name() string {
	if j == nil {
		return ""
	}
	return j.name
}

// Policy returns the job's policy, defaults filled in.
func (j *Job) Policy() Policy {
	if j == nil {
		return Policy{}
	}
	return j.policy
}

// Start starts a run of the slot of this moment by the server's clock (see
// Policy.Period and Policy.Tolerance), or — for an AtLeast-only job — a run
// if none started within Policy.AtLeast. It returns the [Run], which the
// caller must end with [Run.End] or [Run.Finish]; or a [*TakenError] naming
// the run that has the slot; or an error wrapping [ErrBusy] when another
// slot's run held the job until this slot's window closed (Start waits for
// it until then); or one wrapping [ErrWindowClosed] when the Start came to
// mark the run after the window closed or a later slot ran (it stalled).
// Either way the slot was not run. ctx bounds the whole call, that wait
// included.
func (j *Job) Start(ctx context.Context) (*Run, error) {
	if err := j.check(ctx); err != nil {
		return nil, err
	}
	if j.policy.Period == 0 && j.policy.AtLeast == 0 {
		return nil, fmt.Errorf("job %q: start: %w", j.name,
			invalid("Policy has neither Period nor AtLeast: use StartSlot with explicit slot keys"))
	}
	return j.start(ctx, "")
}

// StartSlot is [Job.Start] for a slot the caller names: key is the slot's
// key, the same on every replica. Keys are opaque text, compared byte for
// byte: for a tick's scheduled time pass [SlotKey](tick), which spells
// each instant one way ("2026-11-23T04:00:00Z" and
// "2026-11-23T05:00:00+01:00" would be two slots). The server's clock
// plays no part but for Policy.AtLeast, and an explicit slot has no
// window: a run of another slot that holds the job is waited for until
// ctx ends.
func (j *Job) StartSlot(ctx context.Context, key string) (*Run, error) {
	if err := j.check(ctx); err != nil {
		return nil, err
	}
	if err := checkText("slot key", key); err != nil {
		return nil, fmt.Errorf("job %q: %w", j.name, err)
	}
	return j.start(ctx, key)
}

func (j *Job) check(ctx context.Context) error {
	if err := j.usable(); err != nil {
		return err
	}
	if ctx == nil {
		return fmt.Errorf("job %q: %w", j.name, errNilCtx)
	}
	return nil
}

func (j *Job) start(ctx context.Context, key string) (*Run, error) {
	sl, prev, err := j.peek(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("schedule: job %q: read the server clock and the slot: %w", j.name, j.r.explain(err))
	}
	if prev != nil && j.taken(*prev) {
		return nil, j.takenBy(ctx, sl, *prev)
	}
	if j.hooks.afterPeek != nil {
		j.hooks.afterPeek()
	}
	l, err := j.acquire(ctx, sl)
	if err != nil {
		return nil, err
	}
	if j.hooks.beforeMark != nil {
		j.hooks.beforeMark()
	}
	run, err := j.mark(ctx, l, sl)
	if err != nil {
		rctx, cancel := detached(ctx, cleanupTimeout)
		defer cancel()
		_ = l.Release(rctx) // whatever its outcome, the lease ends (see lease.Lease.Release)
		return nil, err
	}
	return run, nil
}

// taken reports whether rec, a run found for the slot by peek, takes it
// for sure. With RerunCrashed, a run recorded as running may have crashed:
// the decision is then made under the job's lease.
func (j *Job) taken(rec Record) bool {
	return !(j.policy.RerunCrashed && (rec.Outcome == Running || rec.Outcome == Crashed))
}

// takenBy returns the TakenError for rec, settling a running record.
func (j *Job) takenBy(ctx context.Context, sl slot, rec Record) error {
	if rec.Outcome == Running {
		if settled, err := j.r.settle(ctx, rec); err == nil {
			rec = settled
		}
	}
	return &TakenError{Job: j.name, Slot: sl.key, At: sl.at, By: rec}
}

// peek reads the server's clock, decides the slot and returns the newest
// run that has it, if any. One statement, a read: an error leaves nothing
// behind, whatever its outcome.
func (j *Job) peek(ctx context.Context, key string) (slot, *Record, error) {
	p := j.policy
	var explicit pgtype.Text
	period := int64(0)
	if key != "" {
		explicit = pgtype.Text{String: key, Valid: true}
	} else if p.Period > 0 {
		period = p.Period.Microseconds()
	}
	var (
		sl        slot
		slotStart pgtype.Timestamptz
	)
	rec, found, err := scanRecord(j.name, j.r.cfg.Pool.QueryRow(ctx, j.r.q.peek, j.r.args(j.name, period,
		p.Tolerance.Microseconds(), explicit, p.AtLeast.Microseconds())...).Scan, &sl.at, &slotStart)
	if err != nil {
		return slot{}, nil, err
	}
	sl.local = time.Now()
	switch {
	case key != "":
		sl.key = key
	case slotStart.Valid:
		sl.start = slotStart.Time
		sl.key = SlotKey(sl.start)
		sl.closes = sl.start.Add(p.Period - p.Tolerance)
	default:
		sl.every = true
		sl.key = SlotKey(sl.at)
	}
	if !found {
		return sl, nil, nil
	}
	return sl, &rec, nil
}

// acquire takes the job's lease for a run of sl. A holder that runs or
// starts this very slot makes it taken; a holder of another slot's run is
// waited for — until the slot's window closes, for a period slot.
func (j *Job) acquire(ctx context.Context, sl slot) (*lease.Lease, error) {
	store := j.r.cfg.Store
	ttl, keep := j.policy.leaseTTL()
	meta, _ := json.Marshal(leaseMeta{Slot: sl.key})
	opts := []lease.Option{lease.WithMetadata(meta)}
	if keep {
		opts = append(opts, lease.WithKeepAlive())
	}
	l, err := store.TryAcquire(ctx, j.lease, ttl, opts...)
	var held *lease.HeldError
	if !errors.As(err, &held) {
		if err != nil {
			return nil, fmt.Errorf("schedule: job %q slot %s: %w", j.name, sl.key, err)
		}
		return l, nil
	}
	if info, err := store.Get(ctx, j.lease); err == nil && info.Held && (sl.every || sl.same(slotOfMeta(info.Metadata))) {
		return nil, j.startedBy(ctx, sl, info)
	}
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if !sl.closes.IsZero() {
		wctx, cancel = context.WithDeadline(ctx, sl.local.Add(sl.closes.Sub(sl.at)))
	}
	defer cancel()
	if j.hooks.waiting != nil {
		j.hooks.waiting()
	}
	l, err = store.Acquire(wctx, j.lease, ttl, opts...)
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		return nil, j.busy(ctx, sl, held)
	}
	if err != nil {
		return nil, fmt.Errorf("schedule: job %q slot %s: %w", j.name, sl.key, err)
	}
	return l, nil
}

// busy returns the error of a Start whose wait for the job, held by
// another run (held), lasted until the slot's window closed: a TakenError
// if the slot has a run — another waiter's — or else an error wrapping
// ErrBusy and ErrWindowClosed.
func (j *Job) busy(ctx context.Context, sl slot, held *lease.HeldError) error {
	if rec, found, err := j.slotRun(ctx, sl); err == nil && found && j.taken(rec) {
		return j.takenBy(ctx, sl, rec)
	}
	return fmt.Errorf("%w: job %q slot %s not run: the job was held (token %d, owner %s) until the slot's window closed at %s (%w)",
		ErrBusy, j.name, sl.key, held.Token, held.Owner, SlotKey(sl.closes), ErrWindowClosed)
}

// slotRun reads the newest run that has sl (see peek), if any.
func (j *Job) slotRun(ctx context.Context, sl slot) (Record, bool, error) {
	q := j.r
	return scanRecord(j.name, q.cfg.Pool.QueryRow(ctx, q.q.slot, q.args(j.name, sl.key, j.policy.AtLeast.Microseconds(), sl.startArg())...).Scan)
}

// startedBy returns the TakenError of a slot whose job another replica
// holds to start that slot (info is its lease). If the slot has a run
// already — the holder read it as free before that run, and will find it
// taken — the error names that run instead.
func (j *Job) startedBy(ctx context.Context, sl slot, info lease.Info) error {
	rec, found, err := j.slotRun(ctx, sl)
	if err == nil && found && j.taken(rec) {
		return j.takenBy(ctx, sl, rec)
	}
	return &TakenError{Job: j.name, Slot: sl.key, At: sl.at, By: Record{
		Job: j.name, Slot: slotOfMeta(info.Metadata), Owner: info.Owner, Token: info.Token,
		Hostname: info.Hostname, PID: info.PID, Start: info.AcquiredAt, Outcome: Running,
	}}
}

// leaseMeta is the metadata of a run's lease: the slot it runs.
type leaseMeta struct {
	Slot string `json:"slot"`
}

// slotOfMeta returns the slot recorded in a run's lease metadata.
func slotOfMeta(doc json.RawMessage) string {
	var m leaseMeta
	_ = json.Unmarshal(doc, &m)
	return m.Slot
}
