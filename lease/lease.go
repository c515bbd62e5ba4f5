package lease

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/internal/plant"
	"github.com/pglocks/pglocks/internal/quietloss"
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
	hold       *time.Timer // ends the lease at its maximum hold (WithMaxHold); nil without
	quietLoss  bool        // acquired with internal/quietloss: its loss is logged at Debug

	ka *keepAlive // nil without keep-alive
}

// newLease makes the Lease of an acquisition the server confirmed, trusted
// from start (see trustStart). If the store closed meanwhile, a fresh
// acquisition (fresh) is released again before ErrClosed is returned, so
// that no row is left held by a caller who got an error; a resumed one is
// left as it was.
func (s *Store) newLease(ctx context.Context, name string, owner uuid.UUID, token int64, ttl time.Duration, expiresAt, start time.Time, o options, fresh bool) (*Lease, error) {
	l := &Lease{store: s, name: name, owner: owner, token: token, ttl: ttl, lost: make(chan struct{}), expiresAt: expiresAt,
		quietLoss: quietloss.Is(ctx)}
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	l.trustUntil = start.Add(ttl - s.cfg.margin(ttl))
	l.mu.Lock() // before track: Store.Close may abandon l at once
	defer l.mu.Unlock()
	live, err := s.track(l)
	if err != nil {
		l.ended, l.err = true, err
		l.cancel(err)
		if fresh {
			return nil, s.releaseTaken(ctx, name, owner, token, ttl, err)
		}
		return nil, err
	}
	if live != nil { // a Resume that raced this one made the acquisition's Lease
		l.ended, l.err = true, ErrNotHeld
		l.cancel(l.err)
		return live, nil
	}
	l.trust = time.AfterFunc(l.trustUntil.Sub(s.cfg.Now()), l.checkTrust)
	l.at = s.observeStart(name, token)
	if o.keepAlive {
		l.startKeepAlive()
	}
	if o.maxHold > 0 {
		l.limitHold(o.maxHold)
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
	if l.hold != nil {
		l.hold.Stop()
	}
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

// Assert checks with the server that the lease is still held with at least
// atLeast left by the server clock: call it before a step that must
// finish under the lease. Not held: an error wrapping
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
	err := tx.QueryRow(ctx, l.store.q.guardSQL, txArgs(tx, l.args())...).Scan(&exp)
	if err := noRows(l.store.pool.t.explainGuard(tx, l.store.q.guardSQL, err)); err != nil {
		return fmt.Errorf("guard lease %q: %w", short(l.name), err)
	}
	return nil
}
