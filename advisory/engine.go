package advisory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/pglocks/pglocks/internal/dial"
	"github.com/pglocks/pglocks/internal/engine"
	"github.com/pglocks/pglocks/internal/outcome"
)

// engineCheck proves, per server a Locker's connections reach, that the
// server's session advisory locks exclude across sessions (see
// [ErrLocksDoNotExclude]). Each accepted connection reads its server's
// identity (one round trip: the postmaster's start time, port and
// database; see [engine.Server]); a server proved before costs no more,
// and a new one — after a failover to another cluster, or a restart — is
// probed again. A failure is confirmed by a second probe on a fresh pair
// of connections before it is kept as the refusal for that server; two
// probes that disagree, or a probe that failed on the way (a transport or
// server error, a second connection that reached another server, a
// standby or the same backend), are no verdict: the dial fails and the
// next one probes again. mu is held across a probe (dial's ctx bounds
// it), so concurrent dials wait for one probe rather than each run their
// own.
type engineCheck struct {
	proved  atomic.Pointer[string] // the Key of the server last proved
	mu      sync.Mutex
	refused string // under mu: the Key of the server refused, and why
	refuse  error
}

// proveEngine runs the check for conn (see [engineCheck]).
func (l *Locker) proveEngine(ctx context.Context, conn dial.Conn) error {
	e := &l.engine
	srv, err := engine.Identify(ctx, conn.PgConn())
	if err != nil {
		return err
	}
	key := srv.Key()
	if p := e.proved.Load(); p != nil && *p == key {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if p := e.proved.Load(); p != nil && *p == key {
		return nil
	}
	if e.refuse != nil && e.refused == key {
		return e.refuse
	}
	if err := l.probeEngine(ctx, conn, key); err != nil {
		return err
	}
	e.proved.Store(&key)
	return nil
}

// errProbesDisagree: a probe found the locks do not exclude and its
// confirmation found they do.
var errProbesDisagree = errors.New("engine probe: two probes disagree whether the server's session locks exclude: no verdict")

// probeEngine probes the server of conn (whose identity is key) and, on a
// failure, confirms it on a fresh pair; a confirmed failure is kept (see
// [engineCheck]). It returns nil if the locks exclude.
func (l *Locker) probeEngine(ctx context.Context, conn dial.Conn, key string) error {
	_, f, err := engine.SessionOnly(ctx, l.poolCfg, conn)
	if err != nil || f == nil {
		return err
	}
	fresh, err := dial.Dedicated(ctx, l.poolCfg, dial.Options{ApplicationName: "pglocks engine probe"})
	if err != nil {
		return fmt.Errorf("engine probe: confirming %v: %w", f, err)
	}
	defer fresh.Close(context.WithoutCancel(ctx))
	srv, again, err := engine.SessionOnly(ctx, l.poolCfg, fresh)
	switch {
	case err != nil:
		return fmt.Errorf("engine probe: confirming %v: %w", f, err)
	case srv.Key() != key:
		return fmt.Errorf("engine probe: confirming %v: the fresh connection reached %v: no verdict", f, srv)
	case again == nil:
		return fmt.Errorf("%w (the first found %v)", errProbesDisagree, f)
	}
	l.engine.refused = key
	l.engine.refuse = outcome.MarkFatal(fmt.Errorf("%w: %s", ErrLocksDoNotExclude, again))
	return l.engine.refuse
}
