package lease

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/pglocks/pglocks/internal/backoff"
	"github.com/pglocks/pglocks/internal/reach"
)

// busy is what a failed try of a set reports to await: the names whose
// release may let the next try pass, and the longest it need wait for a
// holder that vanishes (the soonest expiry it saw); locked: some rows
// were free but locked by other transactions, whose end nothing
// announces, so the wait is at most a growing backoff.
type busy struct {
	watch  []string
	wait   time.Duration
	locked bool
}

// await runs try until it returns neither a busy set (watch) nor a
// retryable error, waiting between tries as Store.acquire does: the
// first time a name is to be watched, it registers with the listener and
// tries again before waiting (a release in between would go unheard
// otherwise); then it waits for a release of any watched name, for the
// soonest expiry (plus jitter), for ctx or for Close. Errors a later try
// may not meet are retried with capped, jittered backoff.
func (s *Store) await(ctx context.Context, try func(ctx context.Context) (busy, error)) error {
	ws := waitSet{s: s, ws: make(map[string]*waiter)}
	defer ws.close()
	var bo backoff.Backoff
	for {
		b, err := try(ctx)
		var wait time.Duration
		switch {
		case err == nil:
			return nil
		case b.watch != nil:
			reach.Answered(ctx) // the server answered: held
			added, werr := ws.watch(ctx, b.watch)
			if werr != nil {
				return werr
			}
			if added {
				if perr := s.stopped(ctx); perr != nil {
					return perr
				}
				continue
			}
			wait = ws.lis.pollWait(b.wait + jitter(b.wait))
			if next := bo.Next(); b.locked && (b.wait == 0 || next < wait) {
				wait = next // rows locked: poll them with backoff, or wait for the soonest expiry if sooner
			} else if !b.locked {
				bo.Reset()
			}
		case retryable(err) && ctx.Err() == nil:
			wait = bo.Next()
		default:
			return err
		}
		if perr := ws.park(ctx, wait); perr != nil {
			if errors.Is(perr, ErrClosed) {
				return perr
			}
			return fmt.Errorf("%w (%w)", perr, err)
		}
	}
}

// waitSet is the listener registrations of one waiting call, one per
// name it watches.
type waitSet struct {
	s   *Store
	lis *listener
	ws  map[string]*waiter
}

// watch registers the names not yet watched and waits until their
// interest is settled; it reports whether it added any.
func (w *waitSet) watch(ctx context.Context, names []string) (bool, error) {
	if w.lis == nil {
		lis, err := w.s.listener()
		if err != nil {
			return false, err
		}
		w.lis = lis
	}
	var added []*waiter
	for _, name := range names {
		if w.ws[name] == nil {
			w.ws[name] = w.lis.register(name)
			added = append(added, w.ws[name])
		}
	}
	for _, wt := range added {
		w.lis.awaitReady(ctx, wt)
	}
	return len(added) > 0, nil
}

// park is Store.park woken by a release of any watched name.
func (w *waitSet) park(ctx context.Context, wait time.Duration) error {
	t := time.NewTimer(wait)
	defer t.Stop()
	w.s.parked.Add(1)
	defer w.s.parked.Add(-1)
	cases := []reflect.SelectCase{
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(t.C)},
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.s.ctx.Done())},
	}
	for _, wt := range w.ws {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(wt.wake)})
	}
	switch i, _, _ := reflect.Select(cases); i {
	case 1:
		return context.Cause(ctx)
	case 2:
		return ErrClosed
	}
	return nil
}

// close unregisters every name.
func (w *waitSet) close() {
	for name, wt := range w.ws {
		w.lis.unregister(name, wt)
	}
}
