package leader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/internal/dial"
	"github.com/pglocks/pglocks/internal/pooler"
	"github.com/pglocks/pglocks/lease"
)

// Leader reads the election's current state from the lease row. Held is
// false when no candidate leads now; an election never held returns a zero
// Leader (but for Election) and no error.
func (e *Elector) Leader(ctx context.Context) (Leader, error) {
	if err := e.usable(); err != nil {
		return Leader{}, fmt.Errorf("leader: read: %w", err)
	}
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
// Observe opens one connection of its own for LISTEN while it runs, the
// way the pool opens its connections (its hooks too), outside MaxConns; it
// does not need Run. Behind a pooler in transaction mode, where LISTEN does
// not work, it finds so by a probe, logs it once and only polls. For a nil
// or zero Elector, or a nil ctx, the channel is closed at once.
func (e *Elector) Observe(ctx context.Context) <-chan Leader {
	out := make(chan Leader, 1)
	if e.usable() != nil || ctx == nil {
		close(out) // nothing to observe: a nil or zero Elector, or no ctx
		return out
	}
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
		err := o.listen(ctx)
		if errors.Is(err, errTransactionPooling) {
			o.e.cfg.Logger.Warn("leader: observe: the pool is behind a pooler that moves sessions (transaction or statement mode), where LISTEN does not work: polling",
				"election", o.e.cfg.Name, "every", o.e.cfg.RetryInterval)
			o.poll(ctx)
			return
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
	hb := dial.NewHeartbeat(dial.ListenIdleTimeout)
	for {
		if !o.check(ctx) {
			return ctx.Err()
		}
		if err := o.await(ctx, conn, hb, time.Now().Add(o.pollWait())); err != nil {
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
// the connection failed or ctx ended. It sends the heartbeat's round trips
// meanwhile (notifications are no activity to the server).
func (o *observer) await(ctx context.Context, conn *pgx.Conn, hb *dial.Heartbeat, deadline time.Time) error {
	for {
		wctx, cancel := context.WithDeadline(ctx, earlier(deadline, hb.Deadline()))
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil && (ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded)) {
			return err
		}
		if err := hb.Beat(ctx, conn.PgConn(), dial.ListenIdleTimeout/2); err != nil {
			return err
		}
		switch {
		case err == nil && n.Payload == o.e.cfg.Name:
			return nil
		case err != nil && !time.Now().Before(deadline):
			return nil
		}
		// Another election's news (no read), or a heartbeat: wait on.
	}
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// check reads the state and sends it if it changed; false if ctx ended.
func (o *observer) check(ctx context.Context) bool {
	l, err := o.e.Leader(ctx)
	if err != nil {
		return ctx.Err() == nil
	}
	if o.sent && sameTerm(l, o.last) && l.Value == o.last.Value {
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

// errTransactionPooling: the pool is behind a pooler in transaction mode.
var errTransactionPooling = errors.New("transaction pooling")

// listen opens a dedicated connection the way the pool opens its own (its
// hooks too; it takes none of the pool's connections), LISTENs on it and
// loops until it fails. Behind a pooler in transaction mode it returns
// errTransactionPooling without LISTENing or setting anything: both would
// stay on whichever server session ran them. The connection's
// idle_session_timeout is dial.ListenIdleTimeout and await sends a round
// trip every half of it, so that a follower cut off from the network
// behind a session-mode pooler, which keeps a dead client's server session
// for hours, is ended by the server (TestPartitionedObserveEnds).
func (o *observer) listen(ctx context.Context) error {
	poolCfg := o.e.cfg.Pool.Config()
	conn, err := dial.Dedicated(ctx, poolCfg, dial.Options{
		Check: func(ctx context.Context, conn dial.Conn) error {
			if !pooler.Behind(conn) {
				return nil
			}
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			mode, err := pooler.Probe(pctx, poolCfg, conn)
			if err != nil {
				return err
			}
			if !mode.KeepsSession() {
				return errTransactionPooling
			}
			return nil
		},
		IdleSessionTimeout: dial.ListenIdleTimeout,
	})
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "listen "+pgx.Identifier{o.e.cfg.Channel}.Sanitize(), pgx.QueryExecModeSimpleProtocol); err != nil {
		return err
	}
	return o.loop(ctx, conn.Conn)
}

// poll reads the state every RetryInterval (with jitter), or just after the
// current term's expiry if sooner, until ctx ends.
func (o *observer) poll(ctx context.Context) {
	for o.check(ctx) && sleep(ctx, o.pollWait()) {
	}
}
