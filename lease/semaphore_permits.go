package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Permits are the permits of one [Semaphore] acquisition: one [Lease]
// per permit, all taken in one statement. Each lease renews, releases,
// fences and is lost on its own; Permits ends when any of them does:
// [Permits.Context] is cancelled (with that lease's cause) and, if the
// lease was lost, [Permits.Lost] is closed. Work that needs all its
// permits should watch Context. Its methods are safe for concurrent use.
type Permits struct {
	sem    string
	leases []*Lease

	ctx      context.Context
	cancel   context.CancelCauseFunc
	lost     chan struct{}
	lostOnce sync.Once
}

// newPermits watches the leases of one acquisition.
func newPermits(sem string, leases []*Lease) *Permits {
	p := &Permits{sem: sem, leases: leases, lost: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancelCause(context.Background())
	for _, l := range leases {
		context.AfterFunc(l.Context(), func() {
			select {
			case <-l.Lost():
				p.lostOnce.Do(func() { close(p.lost) })
			default:
			}
			p.cancel(context.Cause(l.Context()))
		})
	}
	return p
}

// usable returns an error for a nil or zero Permits.
func (p *Permits) usable() error {
	switch {
	case p == nil:
		return errors.New("lease: nil *Permits")
	case p.ctx == nil:
		return errors.New("lease: zero Permits: they come from Semaphore.TryAcquire or Acquire")
	}
	return nil
}

// N returns the number of permits (0 for nil Permits).
func (p *Permits) N() int {
	if p.usable() != nil {
		return 0
	}
	return len(p.leases)
}

// Leases returns one lease per permit, in slot order (nil for nil
// Permits).
func (p *Permits) Leases() []*Lease {
	if p.usable() != nil {
		return nil
	}
	return append([]*Lease(nil), p.leases...)
}

// Tokens returns the fencing token of each permit, in the order of
// Leases: each greater than every earlier token of its slot.
func (p *Permits) Tokens() []int64 {
	if p.usable() != nil {
		return nil
	}
	ts := make([]int64, len(p.leases))
	for i, l := range p.leases {
		ts[i] = l.Token()
	}
	return ts
}

// Context returns a context cancelled when any permit's lease ends — lost,
// released or abandoned by Store.Close — with that lease's cause. Nil or
// zero Permits' is cancelled.
func (p *Permits) Context() context.Context {
	if err := p.usable(); err != nil {
		return endedContext(err)
	}
	return p.ctx
}

// Lost returns a channel closed when any permit's lease is lost (see
// [Lease.Lost]); nil or zero Permits' is closed.
func (p *Permits) Lost() <-chan struct{} {
	if p.usable() != nil {
		return noLost
	}
	return p.lost
}

// Release releases every permit, concurrently, each as [Lease.Release]
// does (so each ends whatever its outcome), and returns their errors
// joined. ctx bounds the calls.
func (p *Permits) Release(ctx context.Context) error {
	if err := p.usable(); err != nil {
		return fmt.Errorf("release permits: %w", err)
	}
	if err := checkCtx(ctx); err != nil {
		return fmt.Errorf("release permits of %q: %w", short(p.sem), err)
	}
	errs := make([]error, len(p.leases))
	if len(p.leases) == 1 {
		errs[0] = p.leases[0].Release(ctx)
	}
	var wg sync.WaitGroup
	for i, l := range p.leases {
		if len(p.leases) == 1 {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = l.Release(ctx)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("release permits of %q: %w", short(p.sem), err)
	}
	return nil
}
