package leader

import (
	"context"
	"errors"
	"fmt"
	"github.com/pglocks/pglocks/internal/failrun"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/internal/backoff"
	"github.com/pglocks/pglocks/internal/outcome"
	"github.com/pglocks/pglocks/lease"
)

var (
	// ErrRunning is returned by [Elector.Run] while another Run of the same
	// Elector is under way.
	ErrRunning = errors.New("leader: already running")
	// ErrClosed is returned by an [Elector]'s methods after Close.
	ErrClosed = errors.New("leader: elector closed")
	// ErrLost is the cause of a leader's context when leadership was lost:
	// its advisory session died, its lease was lost or broken, or it could
	// no longer trust either in time.
	ErrLost = errors.New("leader: leadership lost")
	// ErrResigned is the cause of a leader's context after [Elector.Resign].
	ErrResigned = errors.New("leader: resigned")
	// ErrStopped is the cause of a leader's context when Run's ctx ended.
	ErrStopped = errors.New("leader: stopped")
	// ErrWorkDone is the cause of a leader's context when its work function
	// returned: the leader steps down and campaigns again.
	ErrWorkDone = errors.New("leader: work returned")
	// ErrStaleLeader is reported by [Elector.State] while the election
	// waits for the server to drop the session of a leader whose term
	// expired, a session it may not terminate (see the package doc).
	ErrStaleLeader = errors.New("leader: waiting for a stale leader's session to end")
)

// Elector campaigns in one named election: [Elector.Run] makes this
// candidate the leader whenever it can and runs the leader's work for as
// long as it leads. Its methods are safe for concurrent use.
type Elector struct {
	cfg       Config
	key       pglocks.Key
	leaseName string
	ownLocker bool
	ownStore  bool

	storeNow func() time.Time // the Store's clock
	margin   time.Duration    // the Store's safety margin for our TTL
	life     context.Context  // cancelled by Close
	kill     context.CancelCauseFunc

	mu      sync.Mutex
	mode    Mode // cfg.Mode; in ModeAuto, what the first campaign found
	running bool
	runExit chan struct{} // closed when the current Run returns
	closed  bool
	current *tenure
	cand    *lease.Lease // the candidate row, while Run is under way
	tending bool         // a tend watches cand (the leader's)
	dupOnce sync.Once    // logs a duplicate Identity once
	val     string       // the value published (Config.Value, then Proclaim's)
	resv    reservation  // the last hand-over reservation seen (campaign only)
	sweptAt time.Time    // the last sweep of idle candidate and request rows
	stuck   stuck        // an expired term whose lock another session holds (watchers only)

	closeDone chan struct{} // closed once Close's work is done; closeErr is set before
	closeErr  error
	lastErr   error
	errAt     time.Time
	reachedAt time.Time // the last time a campaign step got an answer from the database
	// Runs of failures of campaigns and of reads of the lease row, for
	// the Logger (see failed).
	campaignFails, readFails failrun.Run
}

// tenure is a term being led: the two things held (one, lease-only), and
// the ways to end it.
type tenure struct {
	term    Term
	endTerm context.CancelCauseFunc // ends term.Context: called once stepped down
	lock    *advisory.Lock          // nil for a lease-only term
	lease   *lease.Lease
	resign  chan struct{} // closed by Resign or HandOver
	once    sync.Once
	why     error         // the reason given with resign, set before it closes
	handTo  string        // the hand-over's target, set before resign closes
	done    chan struct{} // closed once stepped down
}

// New returns an elector for cfg.Name. It validates cfg — errors wrap
// [ErrInvalidConfig] and name the field — and, where cfg has no Locker or
// Store, makes its own on cfg.Pool.
func New(cfg Config) (*Elector, error) {
	if cfg.Pool == nil {
		return nil, fmt.Errorf("%w: Pool is nil", ErrInvalidConfig)
	}
	e := &Elector{mode: cfg.Mode}
	if cfg.Locker == nil && cfg.Mode != ModeLeaseOnly {
		l, err := advisory.New(cfg.Pool, advisory.Config{Logger: cfg.Logger, Observer: cfg.Observer})
		if err != nil {
			return nil, fmt.Errorf("leader: %w", err)
		}
		cfg.Locker, e.ownLocker = l, true
	}
	ping := advisory.DefaultPingInterval
	if cfg.Locker != nil {
		ping = cfg.Locker.Config().PingInterval
	}
	explicit := cfg.RenewInterval != 0
	cfg.setDefaults(ping)
	if err := cfg.validate(ping); err != nil {
		e.closeOwned(context.Background(), cfg)
		return nil, err
	}
	if err := e.useStore(&cfg, explicit); err != nil {
		e.closeOwned(context.Background(), cfg)
		return nil, err
	}
	e.cfg = cfg
	e.key = pglocks.KeyOf(leaseName(cfg.Name))
	e.leaseName = leaseName(cfg.Name)
	sc := cfg.Store.Config()
	e.storeNow, e.margin = sc.Now, sc.SafetyMargin
	if e.storeNow == nil {
		e.storeNow = time.Now
	}
	if e.margin == 0 {
		e.margin = cfg.TTL / 10
	}
	e.life, e.kill = context.WithCancelCause(context.Background())
	e.val = cfg.Value
	return e, nil
}

// Config returns the elector's configuration, defaults filled in.
func (e *Elector) Config() Config {
	if e == nil {
		return Config{}
	}
	return e.cfg
}

// Key returns the advisory-lock key the campaign takes (but in
// ModeLeaseOnly).
func (e *Elector) Key() pglocks.Key {
	if e == nil {
		return pglocks.Key{}
	}
	return e.key
}

// Close ends the elector: a Run under way stops as if its ctx had ended —
// the leader's work is cancelled and, once it has returned, the leader
// steps down — and returns an error wrapping [ErrClosed]; Close waits for
// that, then closes the Locker and Store the elector made itself (none, if
// the Config supplied both). ctx bounds only the wait: if it ends first,
// Close returns an error and the closing goes on — the elector's own Locker
// and Store are closed once Run returns — and a later Close waits for it
// again and returns its result.
func (e *Elector) Close(ctx context.Context) error {
	if err := e.usable(); err != nil {
		return fmt.Errorf("leader: close: %w", err)
	}
	if ctx == nil {
		return fmt.Errorf("leader: close %q: nil context", e.cfg.Name)
	}
	e.mu.Lock()
	if !e.closed {
		e.closed = true
		e.closeDone = make(chan struct{})
		go e.finishClose(e.runExit)
	}
	done := e.closeDone
	e.mu.Unlock()
	e.kill(ErrClosed)
	select {
	case <-done:
		return e.closeErr
	case <-ctx.Done():
		return fmt.Errorf("leader: close %q: Run has not returned, or what the elector made is not closed yet (it will be): %w",
			e.cfg.Name, context.Cause(ctx))
	}
}

// finishClose waits for Run to return (exit, if Run was running), then
// closes what the elector made for itself, whether or not a Close still
// waits for it: a Close that gives up early leaks nothing.
func (e *Elector) finishClose(exit <-chan struct{}) {
	if exit != nil {
		<-exit
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.closeErr = e.closeOwned(ctx, e.cfg)
	close(e.closeDone)
}

func (e *Elector) closeOwned(ctx context.Context, cfg Config) error {
	var errs []error
	if e.ownStore && cfg.Store != nil {
		errs = append(errs, cfg.Store.Close(ctx))
	}
	if e.ownLocker && cfg.Locker != nil {
		errs = append(errs, cfg.Locker.Close(ctx))
	}
	return errors.Join(errs...)
}

// Current returns this candidate's term while it leads.
func (e *Elector) Current() (Term, bool) {
	if e.usable() != nil {
		return Term{}, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.current == nil {
		return Term{}, false
	}
	return e.current.term, true
}

// Resign steps down if this candidate leads, or has just been elected and
// is about to start its work (then the work is not started): the leader's
// work sees its context cancelled with [ErrResigned], and once it has
// returned the lease is released and the advisory lock unlocked, so that
// another candidate takes over at once. The resigned candidate sits out
// RetryInterval before campaigning again. Resign returns when the step-down
// is complete or ctx ends; it returns nil at once when this candidate does
// not lead.
func (e *Elector) Resign(ctx context.Context) error {
	if err := e.usable(); err != nil {
		return fmt.Errorf("leader: resign: %w", err)
	}
	if ctx == nil {
		return fmt.Errorf("leader: resign %q: nil context", e.cfg.Name)
	}
	e.mu.Lock()
	t := e.current
	e.mu.Unlock()
	if t == nil {
		return nil
	}
	t.once.Do(func() { t.why = ErrResigned; close(t.resign) })
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("leader: resign %q: %w", e.cfg.Name, context.Cause(ctx))
	}
}

// Run campaigns until ctx ends: it waits to be elected, runs lead with a
// context that is cancelled the moment leadership is lost, steps down, and
// campaigns again. lead gets the [Term]; when lead returns while still
// leading, the elector steps down ([ErrWorkDone]) and campaigns again.
//
// When ctx ends, a leader's work is cancelled ([ErrStopped]) and, once it
// has returned, the leader resigns with a fresh context bounded by
// RetryInterval + 5s, and Run returns nil — unless no campaign of this Run
// ever reached the database (none was elected, had a try answered "held"
// or read the lease row) and one failed: then Run returns an error that wraps the last failure (not
// ctx's error), so that a candidate that could not campaign during its
// whole life does not stop as if all was well. When leadership is lost instead,
// the elector steps down at once — releases its lease and unlocks — and
// then waits for lead to return before it campaigns again.
//
// A campaign that fails for a reason retrying cannot fix — the lease table
// is missing, a privilege or the password is wrong, the server is read-only
// (see package internal/outcome) — makes Run return that error at once;
// the lease's wrap [lease.ErrNoTable], [lease.ErrNoPrivilege] or
// [lease.ErrReadOnly] and say what cures them.
// Other failures (the server restarting, a network error) are retried with
// capped, jittered backoff, logged (at Warn once per run of failures, see
// Config.Logger) and reported by [Elector.State].
// Run also returns an error when lead is nil, when the elector is closed
// ([ErrClosed], also when Close is called during Run), or when another Run
// is under way ([ErrRunning]).
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context, term Term) error) error {
	if err := e.usable(); err != nil {
		return fmt.Errorf("leader: Run: %w", err)
	}
	if lead == nil {
		return errors.New("leader: Run: lead is nil")
	}
	if ctx == nil {
		return errors.New("leader: Run: nil context")
	}
	exit, err := e.enter()
	if err != nil {
		return err
	}
	defer e.exit(exit)
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	defer context.AfterFunc(e.life, func() { stop(context.Cause(e.life)) })()

	hooks := newDispatcher()
	defer hooks.close()
	bo := backoff.Backoff{Min: min(100*time.Millisecond, e.cfg.RetryInterval), Max: 2 * e.cfg.RetryInterval}
	began := time.Now()
	var sitOut time.Duration
	defer e.leaveCandidacy()
	for ctx.Err() == nil {
		if sitOut > 0 && !sleep(ctx, sitOut) {
			break
		}
		if err := e.ensureCandidateIfReached(ctx, began); err != nil && ctx.Err() == nil {
			e.setErr(err)
			return fmt.Errorf("leader: election %q: candidate row: %w", e.cfg.Name, err)
		}
		t, err := e.campaign(ctx, hooks)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if errors.Is(err, errYielded) {
				sitOut = 0
				continue
			}
			if fatal(err) {
				e.setErr(err)
				e.cfg.Logger.Error("leader: campaign cannot succeed", "election", e.cfg.Name, "err", err)
				return fmt.Errorf("leader: election %q: %w", e.cfg.Name, err)
			}
			sitOut = bo.Next()
			e.failed(&e.campaignFails, "leader: campaign failed; retrying", err, "retry_in", sitOut)
			continue
		}
		bo.Reset()
		reason := e.lead(ctx, t, lead, hooks)
		sitOut = 0
		if errors.Is(reason, ErrResigned) || errors.Is(reason, ErrWorkDone) {
			sitOut = e.jitter(e.cfg.RetryInterval)
		}
	}
	if e.life.Err() != nil {
		return fmt.Errorf("%w during Run of election %q", ErrClosed, e.cfg.Name)
	}
	if err := e.neverReached(began); err != nil {
		return fmt.Errorf("leader: election %q: Run stopped (%v) before any campaign reached the database: %w",
			e.cfg.Name, context.Cause(ctx), err)
	}
	return nil
}

// enter marks Run as under way.
func (e *Elector) enter() (chan struct{}, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.closed:
		return nil, ErrClosed
	case e.running:
		return nil, ErrRunning
	}
	e.running = true
	e.runExit = make(chan struct{})
	return e.runExit, nil
}

func (e *Elector) exit(ch chan struct{}) {
	e.mu.Lock()
	e.running = false
	e.runExit = nil
	e.mu.Unlock()
	close(ch)
}

// fatal reports whether a campaign error cannot be cured by retrying.
func fatal(err error) bool {
	switch {
	case errors.Is(err, ErrClosed), errors.Is(err, advisory.ErrClosed), errors.Is(err, lease.ErrClosed):
		return true
	case errors.Is(err, lease.ErrTokenRegressed):
		// The term was refused and the counter raised above every term
		// this candidate saw: the next campaign gets a higher one.
		return false
	}
	return outcome.Of(err) == outcome.Fatal
}

// jitter returns d ± 20%.
func (e *Elector) jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// sleep waits d or until ctx ends; false if ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
