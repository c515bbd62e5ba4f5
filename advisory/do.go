package advisory

import (
	"context"
	"errors"
	"fmt"

	"github.com/pglocks/pglocks"
)

// Do runs fn while holding the exclusive lock on key, taken with
// [Locker.Lock] (ctx bounds the wait and is fn's parent context). fn's
// context is cancelled if the lock is lost; Do then returns an error
// wrapping [ErrLost] (joined with fn's error). Otherwise Do unlocks, even if
// ctx has ended or fn panics, and returns fn's error joined with the
// unlock's.
func (l *Locker) Do(ctx context.Context, key pglocks.Key, fn func(ctx context.Context) error) error {
	if fn == nil {
		return opErr("do", key, errors.New("nil fn"))
	}
	lk, err := l.Lock(ctx, key)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(lk.ctx, func() { cancel(context.Cause(lk.ctx)) })
	released := false
	defer func() {
		// fn panicked: release the lock before the panic goes on.
		if !released {
			stop()
			cancel(nil)
			uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.QueryTimeout)
			_ = lk.Unlock(uctx)
			ucancel()
		}
	}()
	ferr := fn(fctx)
	released = true
	stop()
	cancel(nil)
	if lerr := lk.Err(); lerr != nil {
		return errors.Join(opErr("do", key, fmt.Errorf("lock lost while fn ran: %w", lerr)), ferr)
	}
	uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.QueryTimeout)
	defer ucancel()
	return errors.Join(ferr, lk.Unlock(uctx))
}
