package gocronleader

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/pglocks/pglocks/leader"
)

// ErrNotLeader is returned by [Elector.IsLeader] on a replica that holds no
// trusted term.
var ErrNotLeader = errors.New("gocronleader: not the leader")

// Elector is a gocron.Elector on a leader.Elector that campaigns in the
// background. Its methods are safe for concurrent use.
type Elector struct {
	le     *leader.Elector
	cancel context.CancelFunc
	done   chan struct{}
	err    error // Run's result, once done is closed
	once   sync.Once
}

var _ gocron.Elector = (*Elector)(nil)

// Start runs e (leader.Elector.Run) in the background until [Elector.Close],
// holding each term until it ends; e must not be Run elsewhere. Close the
// Elector before e.
func Start(e *leader.Elector) (*Elector, error) {
	if e == nil {
		return nil, errors.New("gocronleader: nil *leader.Elector (make one with leader.New)")
	}
	ctx, cancel := context.WithCancel(context.Background())
	el := &Elector{le: e, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(el.done)
		el.err = e.Run(ctx, func(ctx context.Context, _ leader.Term) error {
			<-ctx.Done()
			return nil
		})
	}()
	return el, nil
}

// IsLeader returns nil while this replica holds a term it trusts, and an
// error wrapping [ErrNotLeader] otherwise — or, once the campaign has
// stopped, the reason. It makes no round trip; ctx is not used.
func (el *Elector) IsLeader(context.Context) error {
	if el == nil || el.le == nil {
		return errors.New("gocronleader: nil or zero Elector (make one with Start)")
	}
	select {
	case <-el.done:
		if el.err != nil {
			return fmt.Errorf("%w: the campaign failed: %w", ErrNotLeader, el.err)
		}
		return fmt.Errorf("%w: closed", ErrNotLeader)
	default:
	}
	term, ok := el.le.Current()
	if !ok {
		return ErrNotLeader
	}
	if until := term.TrustedUntil(); !time.Now().Before(until) {
		return fmt.Errorf("%w: term %d is no longer trusted", ErrNotLeader, term.Number)
	}
	return nil
}

// Close stops the campaign: a leader resigns, so that another replica
// takes over at once. It waits for that, or for ctx to end, and returns the
// campaign's error, if it failed. Shut the scheduler down first, so that
// no run is under way when the term ends.
func (el *Elector) Close(ctx context.Context) error {
	if el == nil || el.le == nil {
		return errors.New("gocronleader: nil or zero Elector (make one with Start)")
	}
	el.once.Do(el.cancel)
	select {
	case <-el.done:
		return el.err
	case <-ctx.Done():
		return fmt.Errorf("gocronleader: close: %w", context.Cause(ctx))
	}
}
