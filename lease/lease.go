package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/internal/outcome"
	"github.com/pglocks/pglocks/internal/plant"
)

// Lease is one acquisition of a named lease: an owner, a fencing token, and
// an expiry by the server clock. Its methods are safe for concurrent use.
//
// A Lease is live from its acquisition until it is released, lost, or
// abandoned by [Store.Close]. It is lost when the server says this (name,
// owner, token) no longer holds it — taken over after expiry, broken — or
// when its local trust deadline passes without a successful renewal: the
// send time of the last successful acquire or renew + TTL − safety margin,
// on the monotonic clock. Loss closes [Lease.Lost] and cancels
// [Lease.Context] with a cause wrapping [ErrLost].
type Lease struct {
	store *Store
	name  string
	owner uuid.UUID
	token int64
	ttl   time.Duration
	at    time.Time // when the hold began (Config.Now), for metrics and logs

	ctx    context.Context // cancelled when the lease ends
	cancel context.CancelCauseFunc
	lost   chan struct{} // closed on loss only

	mu         sync.Mutex
	ended      bool // released, lost or abandoned
	releasing  bool // guarded by mu: a Release is under way; a renew that finds no row leaves the outcome to it
	err        error
	expiresAt  time.Time // server clock
	trustUntil time.Time // local clock, monotonic
	trust      *time.Timer

	ka *keepAlive // nil without keep-alive
}

// newLease makes the Lease of an acquisition the server confirmed, trusted
// from start (see trustStart). If the store closed meanwhile, a fresh
// acquisition (fresh) is released again before ErrClosed is returned, so
// that no row is left held by a caller who got an error; a resumed one is
// left as it was.
func (s *Store) newLease(ctx context.Context, name string, owner uuid.UUID, token int64, ttl time.Duration, expiresAt, start time.Time, keepAlive, fresh bool) (*Lease, error) {
	l := &Lease{store: s, name: name, owner: owner, token: token, ttl: ttl, lost: make(chan struct{}), expiresAt: expiresAt}
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	l.trustUntil = start.Add(ttl - s.cfg.margin(ttl))
	l.mu.Lock() // before track: Store.Close may abandon l at once
	defer l.mu.Unlock()
	if err := s.track(l); err != nil {
		l.ended, l.err = true, err
		l.cancel(err)
		if fresh {
			return nil, s.releaseTaken(ctx, name, owner, token, ttl, err)
		}
		return nil, err
	}
	l.trust = time.AfterFunc(l.trustUntil.Sub(s.cfg.Now()), l.checkTrust)
	l.at = s.observeStart(name, token)
	if keepAlive {
		l.startKeepAlive()
	}
	s.hear() // so that a Break or a takeover ends l at once
	return l, nil
}

// Name returns the lease's name ("" for a nil Lease).
func (l *Lease) Name() string {
	if l == nil {
		return ""
	}
	return l.name
}

// Owner returns the lease's owner id (the zero UUID for a nil Lease).
func (l *Lease) Owner() uuid.UUID {
	if l == nil {
		return uuid.Nil
	}
	return l.owner
}

// Token returns the lease's fencing token: greater than the token of every
// earlier acquisition of the same name. Hand it to a protected resource,
// which refuses writes carrying a token lower than one it has seen. A nil
// Lease's is 0, which no acquisition has.
func (l *Lease) Token() int64 {
	if l == nil {
		return 0
	}
	return l.token
}

// TTL returns the lease's time to live, which every renewal restores (0
// for a nil Lease).
func (l *Lease) TTL() time.Duration {
	if l == nil {
		return 0
	}
	return l.ttl
}

// ExpiresAt returns the lease's expiry by the server clock, as of the last
// successful acquire or renew. Compare it only with server times. A nil
// Lease's is the zero time.
func (l *Lease) ExpiresAt() time.Time {
	if l == nil {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expiresAt
}

// TrustedUntil returns the local deadline until which the lease may be
// trusted without asking the server, a reading of Config.Now. A deadline
// it returns as passed is final: the lease is lost then (Lost, Context), as
// it is when the deadline's timer runs, and a renewal answered later does
// not revive it — on a stalled scheduler that answer can come before the
// timer's turn, and the caller has already stopped trusting. A nil or zero
// Lease's is the zero time.
func (l *Lease) TrustedUntil() time.Time {
	if l.usable() != nil {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ended && !l.store.cfg.Now().Before(l.trustUntil) {
		l.end(l.lapsed(), true)
	}
	return l.trustUntil
}

// Handle returns the lease's (name, owner, token), to resume it elsewhere
// with [Store.Resume] (the zero Handle, which Resume refuses, for a nil
// Lease).
func (l *Lease) Handle() Handle {
	if l == nil {
		return Handle{}
	}
	return Handle{Name: l.name, Owner: l.owner, Token: l.token}
}

// Lost returns a channel closed when the lease is lost (but not when it is
// released or abandoned; see [Lease.Context] for all three). A nil or zero
// Lease holds nothing: its channel is closed.
func (l *Lease) Lost() <-chan struct{} {
	if l.usable() != nil {
		return noLost
	}
	return l.lost
}

// Context returns a context cancelled when the lease ends: lost (cause
// wraps [ErrLost]), released ([ErrReleased]) or abandoned by Store.Close
// ([ErrClosed]). Use context.Cause to tell which. A nil or zero Lease's is
// cancelled, with the cause Err returns.
func (l *Lease) Context() context.Context {
	if err := l.usable(); err != nil {
		return endedContext(err)
	}
	return l.ctx
}

// Err returns nil while the lease is live, else why it ended, as
// context.Cause(l.Context()) does; for a nil or zero Lease, an error
// saying so.
func (l *Lease) Err() error {
	if err := l.usable(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// end marks the lease ended with cause err, once. It closes Lost when err
// is a loss. l.mu must be held.
func (l *Lease) end(err error, isLoss bool) bool {
	if l.ended {
		return false
	}
	l.ended, l.err = true, err
	l.observeEnd(err, isLoss)
	l.trust.Stop()
	if isLoss {
		close(l.lost)
	}
	l.cancel(err)
	if l.ka != nil {
		l.ka.signalStop()
		l.store.kickRenewer()
	}
	l.store.untrack(l)
	return true
}

// checkTrust runs when the trust deadline's timer fires.
func (l *Lease) checkTrust() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	if left := l.trustUntil.Sub(l.store.cfg.Now()); left > 0 { // renewed meanwhile
		l.trust.Reset(left)
		return
	}
	l.end(l.lapsed(), true)
}

// lapsed is why a lease whose trust deadline passed ended.
func (l *Lease) lapsed() error {
	return fmt.Errorf("%w: lease %q: not renewed before its trust deadline", ErrLost, short(l.name))
}

// lose ends the lease because the server said it is not held.
func (l *Lease) lose(op string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.end(fmt.Errorf("%w: lease %q: %s: %w", ErrLost, short(l.name), op, ErrNotHeld), true)
}

// abandon ends the lease without releasing it (Store.Close, which waits
// for the keep-alive).
func (l *Lease) abandon(cause error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.end(cause, false)
}

// args are the (name, owner, token) arguments of the lease's statements.
func (l *Lease) args() []any { return []any{l.name, pgUUID(l.owner), l.token} }

// Renew extends the lease to TTL from now by the server clock, and its
// trust deadline to the send time of this renewal + TTL − safety margin.
// If the lease is no longer held (expired, taken over, broken, released)
// it returns an error wrapping [ErrNotHeld] and the lease is lost. Any
// other error leaves the lease as it was: a renewal whose outcome is
// unknown can only have extended this very acquisition, and the trust
// deadline moves only on a confirmed one. A lease that ended while its
// renewal ran (its passed deadline was read, see [Lease.TrustedUntil])
// stays lost though the server may have extended its row; Release frees
// the row. ctx bounds the round trip.
func (l *Lease) Renew(ctx context.Context) error {
	if err := l.usable(); err != nil {
		return fmt.Errorf("renew lease: %w", err)
	}
	if err := l.renew(ctx); err != nil {
		return fmt.Errorf("renew lease %q: %w", short(l.name), err)
	}
	return nil
}

func (l *Lease) renew(ctx context.Context) (err error) {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if err := l.live(); err != nil {
		return err
	}
	defer func(start time.Time) { l.observeRenew(start, err) }(l.store.cfg.Now())
	var (
		sent  time.Time
		exp   time.Time
		lagUS int64
	)
	err = retrySerialization(ctx, func() error {
		sent = l.store.cfg.Now()
		return noRows(l.store.pool.QueryRow(ctx, l.store.q.renewSQL, l.args()...).Scan(&exp, &lagUS))
	})
	if err == ErrNotHeld {
		l.notHeld("renew")
		return ErrNotHeld
	}
	if err == nil {
		err = ackedLate(ctx)
	}
	if err != nil {
		return err
	}
	return l.renewed(sent, exp, time.Duration(lagUS)*time.Microsecond)
}

// live returns nil while the lease is live, else why it is not.
func (l *Lease) live() error {
	if err := l.store.checkOpen(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return l.endedErr()
	}
	return nil
}

// endedErr is the error of an operation on an ended lease. l.mu held.
func (l *Lease) endedErr() error {
	if l.err == ErrClosed {
		return ErrClosed
	}
	return fmt.Errorf("%w (%w)", ErrNotHeld, l.err)
}

// Release gives the lease up: it clears the owner (the token stays, so the
// next acquisition's is higher) and, if any [Store.Acquire] waits for the
// name, wakes it through NOTIFY, in one statement. It stops the keep-alive
// and waits for it. If the lease was not held any more (expired, taken
// over, broken, already released) the error wraps [ErrNotHeld].
//
// The release does not wait for its WAL flush (see the package doc,
// Durability): a server crash right after it may lose it, and the row then
// shows this acquisition held until its expiry — a delay for the next
// holder, never a second one.
//
// Whatever its outcome, Release ends the Lease: once it has returned, the
// keep-alive is stopped for good and nothing renews the row, so a caller
// that drops the error (a deferred Release) strands no name. Only bad
// input (a nil ctx or Lease) and a closed store leave the Lease as it was.
//
// If the release may have run but no answer came (the reply was lost, ctx
// ended while it ran), another client may already hold the name: the Lease
// ends at once — Lost is closed and Context cancelled, with an error
// wrapping [ErrLost] that says the outcome is unknown — and the release is
// retried in the background until the server answers (for at most the
// TTL, after which the row has expired anyway).
//
// If the release was not sent (no connection could be had: the server
// restarts, say, or ctx ended while it waited in the store's queue), the
// Lease ends as released — Context cancelled with a cause wrapping
// [ErrReleased], Lost left open: nobody else can hold the name until the
// release runs or the row expires — and Release returns an error that
// wraps ErrReleased and says why; the release is retried in the background
// as above, and the row is freed once the server answers (or expires at
// the end of its TTL). A release the server refused without running it (no
// privilege), or one a closed pool cannot send, is not retried: the row
// expires at the end of its TTL. ctx bounds the round trip and the wait.
func (l *Lease) Release(ctx context.Context) error {
	if err := l.usable(); err != nil {
		return fmt.Errorf("release lease: %w", err)
	}
	if err := l.release(ctx); err != nil {
		return fmt.Errorf("release lease %q: %w", short(l.name), err)
	}
	return nil
}

func (l *Lease) release(ctx context.Context) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	s := l.store
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	l.mu.Lock()
	if l.ended && errors.Is(l.err, ErrReleased) {
		l.mu.Unlock()
		return fmt.Errorf("%w (already released)", ErrNotHeld)
	}
	l.releasing = true
	l.mu.Unlock()
	if err := l.stopKeepAlive(ctx); err != nil {
		return err
	}
	released, err := s.releaseOnce(ctx, l.name, l.owner, l.token)
	if err == nil && released {
		s.seen.released(l.name, l.token) // the next try of this store may take the row cheaply
	}
	l.mu.Lock()
	switch {
	case err != nil && outcome.Of(err) == outcome.Unknown:
		err = fmt.Errorf("%w: lease %q: %w: release may have run (%w); it is retried in the background", ErrLost, short(l.name), errUnknown, err)
		l.end(err, true)
		s.releaseLater(l.name, l.owner, l.token, l.ttl)
	case err != nil:
		err = l.notSent(err) // nothing ran; the holder has given the lease up all the same
	case !released:
		if !l.end(fmt.Errorf("%w: lease %q: release: %w", ErrLost, short(l.name), ErrNotHeld), true) {
			err = l.endedErr()
		} else {
			err = ErrNotHeld
		}
	case !l.end(ErrReleased, false):
		// Lost locally (trust deadline) but still ours on the server: freed.
	}
	l.mu.Unlock()
	return err
}

// stopKeepAlive stops the lease's keep-alive, if any, and waits until no
// renewal of it is under way, so that none can commit after the release
// looked at the row (a renewal that checked the row before its expiry and
// committed after the release found it expired would hold it again). If
// ctx ends first, the Release is not abandoned — a caller that gives up
// would leak a row kept alive for good: the lease ends at once (Lost, an
// error wrapping ErrLost) and the release runs in the background once
// that renewal is over. A Release is under way (l.releasing), inside
// enter/exit.
func (l *Lease) stopKeepAlive(ctx context.Context) error {
	l.mu.Lock()
	ka := l.ka
	l.mu.Unlock()
	if ka == nil {
		return nil
	}
	ka.signalStop()
	l.store.kickRenewer()
	if err := ka.wait(ctx); err != nil {
		err = fmt.Errorf("%w: lease %q: release: %w; it goes on in the background", ErrLost, short(l.name), err)
		l.mu.Lock()
		l.end(err, true)
		l.mu.Unlock()
		s := l.store
		name, owner, token := l.name, l.owner, l.token
		s.settle(l.ttl, func(ctx context.Context) error {
			if err := ka.wait(ctx); err != nil {
				return err
			}
			return s.releaseRow(ctx, name, owner, token)
		})
		return err
	}
	return nil
}

// notSent ends the lease after a release that was not sent, or that the
// server refused without running it (err), and returns the error of
// Release: the holder gave the lease up, so it ends as released — not lost:
// nobody else can hold the name before the release runs or the row
// expires — and the release is retried in the background until the server
// answers (see settle) unless retrying cannot help (a closed pool, no
// privilege): then the row expires at the end of its TTL. Either way
// nothing renews it any more. l.mu must be held, and the caller be inside
// enter/exit.
func (l *Lease) notSent(err error) error {
	s := l.store
	if outcome.Of(err) == outcome.Fatal {
		err = fmt.Errorf("%w, not on the server: lease %q: the release failed (%w); the row expires at the end of its TTL", ErrReleased, short(l.name), err)
	} else {
		err = fmt.Errorf("%w, in the background: lease %q: the release could not be sent (%w); it is retried until the server answers", ErrReleased, short(l.name), err)
		s.releaseLater(l.name, l.owner, l.token, l.ttl)
	}
	s.cfg.Logger.Warn("lease: release not sent", "lease", short(l.name), "owner", l.owner, "token", l.token, "err", err)
	l.end(err, false)
	return err
}

// Assert checks with the server that the lease is still held with at least
// atLeast left by the server clock, as seed 001's assertTTL: before a step
// that must finish under the lease. Not held: an error wrapping
// [ErrNotHeld]; held with less time left: one wrapping [ErrTimeLeft]. It
// does not renew. ctx bounds the round trip.
func (l *Lease) Assert(ctx context.Context, atLeast time.Duration) error {
	if err := l.usable(); err != nil {
		return fmt.Errorf("assert lease: %w", err)
	}
	if err := checkCtx(ctx); err != nil {
		return fmt.Errorf("assert lease %q: %w", short(l.name), err)
	}
	if err := l.live(); err != nil {
		return fmt.Errorf("assert lease %q: %w", short(l.name), err)
	}
	var left int64
	if err := noRows(l.store.pool.QueryRow(ctx, l.store.q.assertSQL, l.args()...).Scan(&left)); err != nil {
		return fmt.Errorf("assert lease %q: %w", short(l.name), err)
	}
	if d := time.Duration(left) * time.Microsecond; d < atLeast {
		return fmt.Errorf("assert lease %q: %w: %v left, want at least %v", short(l.name), ErrTimeLeft, d, atLeast)
	}
	return nil
}

// Guard verifies, inside the caller's transaction tx, that the lease is
// still held — same owner and token, not expired by the server clock at
// this moment — and locks its row FOR SHARE until tx ends. No takeover,
// renewal by another owner or [Store.Break] can commit before then, so
// writes made in tx commit only while the lease is really held. Not held:
// an error wrapping [ErrNotHeld]; roll tx back. A Guard also blocks this
// lease's own renewals until tx ends: a guarded transaction is safe for up
// to TTL × (1 − RenewFraction) − SafetyMargin (0.57 × TTL by default; see
// the package doc, Fencing). A nil ctx or tx is an error. ctx bounds the
// statement.
func (l *Lease) Guard(ctx context.Context, tx pgx.Tx) error {
	if err := l.usable(); err != nil {
		return fmt.Errorf("guard lease: %w", err)
	}
	if err := checkCtx(ctx); err != nil {
		return fmt.Errorf("guard lease %q: %w", short(l.name), err)
	}
	if tx == nil {
		return fmt.Errorf("guard lease %q: nil transaction", short(l.name))
	}
	if plant.On(plant.GuardSkipsCheck) {
		return nil // a planted bug, for the chaos suite's oracles
	}
	if err := l.live(); err != nil {
		return fmt.Errorf("guard lease %q: %w", short(l.name), err)
	}
	var exp time.Time
	if err := noRows(tx.QueryRow(ctx, l.store.q.guardSQL, txArgs(tx, l.args())...).Scan(&exp)); err != nil {
		return fmt.Errorf("guard lease %q: %w", short(l.name), err)
	}
	return nil
}
