package leader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/lease"
)

// Leader reads the election's current state from the lease row. Held is
// false when no candidate leads now; an election never held returns a zero
// Leader (but for Election) and no error.
func (e *Elector) Leader(ctx context.Context) (Leader, error) {
	info, err := e.cfg.Store.Get(ctx, e.leaseName)
	if errors.Is(err, lease.ErrNotFound) {
		return Leader{Election: e.cfg.Name}, nil
	}
	if err != nil {
		return Leader{}, fmt.Errorf("leader: read %q: %w", e.cfg.Name, err)
	}
	return leaderFromInfo(e.cfg.Name, info), nil
}

// Observe streams the election's state to followers, for instance to
// forward requests to the leader: it sends the current [Leader] at once and
// again after every change — a new term, a step-down, an expiry. Changes are
// announced through LISTEN/NOTIFY on Config.Channel and arrive within a
// round trip; should notifications fail (a dropped connection, a pooler in
// transaction mode), it polls every RetryInterval and at the current term's
// expiry. The channel is closed when ctx ends or the elector is closed.
// Notifications about other elections on the channel cost no read.
// Observe holds one pool connection for LISTEN while it runs; it does not
// need Run.
func (e *Elector) Observe(ctx context.Context) <-chan Leader {
	out := make(chan Leader, 1)
	go func() {
		defer close(out)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(e.life, cancel)() // Close ends it too
		o := observer{e: e, out: out}
		o.run(ctx)
	}()
	return out
}

type observer struct {
	e    *Elector
	out  chan<- Leader
	last Leader
	sent bool
}

func (o *observer) run(ctx context.Context) {
	for ctx.Err() == nil {
		conn, err := o.e.cfg.Pool.Acquire(ctx)
		if err == nil {
			_, err = conn.Exec(ctx, "listen "+pgx.Identifier{o.e.cfg.Channel}.Sanitize())
			if err == nil {
				err = o.loop(ctx, conn.Conn())
			}
			// The connection may be mid-LISTEN or broken: never reuse it.
			_ = conn.Hijack().Close(context.Background())
		}
		if ctx.Err() != nil {
			return
		}
		o.e.cfg.Logger.Debug("leader: observe: reconnecting", "election", o.e.cfg.Name, "err", err)
		// Poll while reconnecting.
		if !o.check(ctx) || !sleep(ctx, o.e.jitter(o.e.cfg.RetryInterval)) {
			return
		}
	}
}

// loop reads the state, then waits for a notification about this election
// or the next poll, and again, until an error or ctx ends. Notifications
// about other elections on the shared channel are skipped without a read,
// and do not postpone the poll.
func (o *observer) loop(ctx context.Context, conn *pgx.Conn) error {
	for {
		if !o.check(ctx) {
			return ctx.Err()
		}
		if err := o.await(ctx, conn, time.Now().Add(o.pollWait())); err != nil {
			return err
		}
	}
}

// pollWait is how long to wait for news before reading anyway: about
// RetryInterval, or until just after the current term's expiry if sooner
// (from the time left the server reported, not its clock).
func (o *observer) pollWait() time.Duration {
	wait := o.e.jitter(o.e.cfg.RetryInterval)
	if o.last.Held {
		if untilExpiry := time.Until(o.last.localEnd); untilExpiry > 0 && untilExpiry < wait {
			wait = untilExpiry + 5*time.Millisecond
		}
	}
	return wait
}

// await returns nil on news of this election or at deadline, an error if
// the connection failed or ctx ended.
func (o *observer) await(ctx context.Context, conn *pgx.Conn, deadline time.Time) error {
	for {
		wctx, cancel := context.WithDeadline(ctx, deadline)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil && n.Payload != o.e.cfg.Name:
			continue // another election's news: no read
		case err == nil, ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			return nil
		default:
			return err
		}
	}
}

// check reads the state and sends it if it changed; false if ctx ended.
func (o *observer) check(ctx context.Context) bool {
	l, err := o.e.Leader(ctx)
	if err != nil {
		return ctx.Err() == nil
	}
	if o.sent && sameTerm(l, o.last) {
		return true
	}
	select {
	case o.out <- l:
		o.last, o.sent = l, true
		return true
	case <-ctx.Done():
		return false
	}
}
