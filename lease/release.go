package lease

import (
	"context"
	"errors"
	"fmt"

	"github.com/pglocks/pglocks/internal/outcome"
)

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
		l.releaseAfter(ka)
		return err
	}
	return nil
}

// releaseAfter releases the lease's row in the background once the
// renewal of ka under way, if any, is over. The caller must be inside
// enter/exit.
func (l *Lease) releaseAfter(ka *keepAlive) {
	s := l.store
	name, owner, token := l.name, l.owner, l.token
	s.releaseInBackground(l.Handle(), l.ttl, func(ctx context.Context) error {
		if ka != nil {
			if err := ka.wait(ctx); err != nil {
				return err
			}
		}
		return s.releaseRow(ctx, name, owner, token)
	})
}

// releaseDetached is Release for a caller whose ctx has ended: the lease
// ends at once as released (no one else can hold the name before the
// release runs or the row expires), its keep-alive stops, and the row is
// released in the background as after a Release whose ctx ended.
func (l *Lease) releaseDetached() {
	s := l.store
	if s.enter() != nil {
		return // closed: the row expires at the end of its TTL
	}
	defer s.exit()
	l.mu.Lock()
	if l.ended && errors.Is(l.err, ErrReleased) {
		l.mu.Unlock()
		return
	}
	l.releasing = true
	ka := l.ka
	l.end(fmt.Errorf("%w, in the background: lease %q: the caller's context had ended", ErrReleased, short(l.name)), false)
	l.mu.Unlock()
	if ka != nil {
		ka.signalStop()
		s.kickRenewer()
	}
	l.releaseAfter(ka)
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
