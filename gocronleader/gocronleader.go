package gocronleader

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/pglocks/pglocks/internal/outcome"
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

// StartTimeout bounds the read of the election's row that [Start] makes
// before it campaigns.
const StartTimeout = 5 * time.Second

// Start runs e (leader.Elector.Run) in the background until [Elector.Close],
// holding each term until it ends; e must not be Run elsewhere. Close the
// Elector before e.
//
// Start first reads the election's row (leader.Elector.Leader, one round
// trip bounded by [StartTimeout]), so that an election that cannot run —
// the lease table is missing, the role may not read it, the password is
// wrong: errors retrying cannot cure — fails Start with its cause instead
// of a campaign that stops in the background, whose error gocron would
// drop. A server that cannot be reached is not such an error: Start
// returns and the campaign retries. A campaign that stops later (a fatal
// error once running) closes [Elector.Done]; [Elector.Err] says why.
func Start(e *leader.Elector) (*Elector, error) {
	if e == nil {
		return nil, errors.New("gocronleader: nil *leader.Elector (make one with leader.New)")
	}
	pctx, pcancel := context.WithTimeout(context.Background(), StartTimeout)
	_, err := e.Leader(pctx)
	pcancel()
	if err != nil && outcome.Of(err) == outcome.Fatal {
		return nil, fmt.Errorf("gocronleader: start: the election cannot run: %w", err)
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
// stopped, the reason. It makes no round trip; ctx is not used. gocron
// drops IsLeader's error (it skips the run and counts it as skipped,
// nothing logged): watch [Elector.Done] and [Elector.Err], or the
// leader.Elector's State, to learn that the campaign stopped.
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
	if _, ok := el.le.Trusted(); ok {
		return nil
	}
	if term, ok := el.le.Current(); ok {
		return fmt.Errorf("%w: term %d is no longer trusted", ErrNotLeader, term.Number)
	}
	return ErrNotLeader
}

// Done returns a channel closed when the campaign has stopped: after
// [Elector.Close], or when it failed for a reason retrying cannot cure (the
// lease table dropped, a privilege revoked), after which this replica
// never leads again. A nil or zero Elector's is closed.
func (el *Elector) Done() <-chan struct{} {
	if el == nil || el.done == nil {
		return closedChan
	}
	return el.done
}

// Err returns why the campaign stopped once [Elector.Done] is closed: nil
// after Close, the campaign's error after a failure. It is nil while the
// campaign runs.
func (el *Elector) Err() error {
	if el == nil || el.le == nil {
		return errors.New("gocronleader: nil or zero Elector (make one with Start)")
	}
	select {
	case <-el.done:
		return el.err
	default:
		return nil
	}
}

var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

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
