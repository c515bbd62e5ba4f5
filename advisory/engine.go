package advisory

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/pglocks/pglocks/internal/dial"
	"github.com/pglocks/pglocks/internal/engine"
	"github.com/pglocks/pglocks/internal/outcome"
)

// engineCheck proves once per Locker, at its first accepted connection,
// that the server's session advisory locks exclude across sessions (see
// [ErrLocksDoNotExclude]). A verdict either way is kept; a probe that
// failed on the way (a transport or server error) is no verdict and the
// next connection probes again. Once proved, a connection costs one
// atomic load more.
type engineCheck struct {
	proved atomic.Bool
	mu     sync.Mutex // held while probing: concurrent dials wait for one probe
	refuse error      // the kept refusal, under mu
}

// proveEngine runs the check for conn (see [engineCheck]).
func (l *Locker) proveEngine(ctx context.Context, conn dial.Conn) error {
	e := &l.engine
	if e.proved.Load() {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.proved.Load() {
		return nil
	}
	if e.refuse != nil {
		return e.refuse
	}
	f, err := engine.SessionOnly(ctx, l.poolCfg, conn)
	switch {
	case err != nil:
		return err
	case f != nil:
		e.refuse = outcome.MarkFatal(fmt.Errorf("%w: %s", ErrLocksDoNotExclude, f))
		return e.refuse
	}
	e.proved.Store(true)
	return nil
}
