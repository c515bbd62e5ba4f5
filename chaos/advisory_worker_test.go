package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
)

// Advisory operations: outside the fenced-lock model (an advisory lock ends
// with its session, unannounced to the history), so they are checked by
// their trust windows only.
const (
	opLock   = "lock"
	opUnlock = "unlock"
)

// advisoryWorker contends for a few keys, exclusive and shared, until ctx
// ends. Each holder reports the window over which the server certainly
// held its lock: from the reply that granted it to the send time of the
// latest round trip the server answered on its session (Lock.VerifiedAt).
func advisoryWorker(ctx context.Context, rec *recorder, pool *pgxpool.Pool, names int) error {
	lk, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = lk.Close(cctx)
	}()
	return clients(ctx, func(id int64) {
		a := &advisoryW{rec: rec, lk: lk, names: names, id: id}
		for ctx.Err() == nil {
			a.round(ctx)
		}
	})
}

type advisoryW struct {
	rec   *recorder
	lk    *advisory.Locker
	names int
	id    int64
	n     int64
}

func (a *advisoryW) round(ctx context.Context) {
	name := fmt.Sprintf("a%d", rand.N(a.names))
	key := pglocks.KeyOf(name)
	shared := rand.N(3) == 0
	var flag int64
	if shared {
		flag = 1
	}
	id := a.rec.call(opLock, name, 0, flag)
	octx, cancel := opCtx(ctx)
	var l *advisory.Lock
	var err error
	switch blocking := rand.N(3) == 0; {
	case shared && blocking:
		l, err = a.lk.RLock(octx, key)
	case shared:
		l, err = a.lk.TryRLock(octx, key)
	case blocking:
		l, err = a.lk.Lock(octx, key)
	default:
		l, err = a.lk.TryLock(octx, key)
	}
	cancel()
	granted := mono()
	switch {
	case err == nil:
		a.n++
		a.rec.ret(id, resOK, a.rec.acqID(a.id, a.n), flag)
	case errors.Is(err, advisory.ErrLocked):
		a.rec.ret(id, resBusy, 0, 0)
		pause(ctx, 5*time.Millisecond)
		return
	default:
		a.rec.ret(id, resUnknown, 0, 0)
		pause(ctx, 20*time.Millisecond)
		return
	}
	a.hold(ctx, l, name, a.rec.acqID(a.id, a.n), flag, granted)
}

// hold keeps the lock a while, reporting its verified window, and unlocks.
func (a *advisoryW) hold(ctx context.Context, l *advisory.Lock, name string, acq, flag, granted int64) {
	for range 1 + rand.N(4) {
		pause(ctx, time.Duration(rand.N(40))*time.Millisecond)
		if l.Err() != nil {
			break
		}
		now := mono()
		verified := now - time.Since(l.VerifiedAt()).Nanoseconds()
		a.rec.write(event{K: evTrust, Name: name, Tok: acq, Val: flag, T: verified, To: granted})
	}
	id := a.rec.call(opUnlock, name, acq, 0)
	octx, cancel := opCtx(ctx)
	err := l.Unlock(octx)
	cancel()
	switch {
	case err == nil:
		a.rec.ret(id, resOK, 0, 0)
	case errors.Is(err, advisory.ErrNotHeld), errors.Is(err, advisory.ErrLost):
		a.rec.ret(id, resNotHeld, 0, 0)
	default:
		a.rec.ret(id, resUnknown, 0, 0)
	}
}
