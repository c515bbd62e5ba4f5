package chaos

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/lease"
)

// The semaphore workload: half of each worker's clients take permits of
// the lease semaphore semName, half of the advisory semaphore advSemName,
// both of limit semLimit.
const (
	semName    = "s"
	advSemName = "as"
	semLimit   = 3

	// A semaphore acquisition as a whole (Val: n): outside the model,
	// which sees it as one acquire per slot (see semW.acquire), and
	// counted for the run's size.
	opPermits = "permits"
	// An advisory semaphore acquisition (Val: n; ok: Tok its acquisition
	// id) and its release: checked by trust windows and counts only.
	opAdvPermits = "advpermits"
	opAdvRelease = "advrelease"
)

// unmodelled are the operations that the fenced-lock model does not see.
var unmodelled = map[string]bool{opLock: true, opUnlock: true, opPermits: true, opAdvPermits: true, opAdvRelease: true}

// semSlot names permit slot i of semaphore sem, as the lease semaphore
// names its rows ("s#0"); the advisory semaphore's trust windows use the
// same form.
func semSlot(sem string, i int) string { return sem + "#" + strconv.Itoa(i) }

// semaphoreWorker runs the semaphore workload until ctx ends.
func semaphoreWorker(ctx context.Context, rec *recorder, pool *pgxpool.Pool, store *lease.Store) error {
	sem, err := store.Semaphore(semName, semLimit)
	if err != nil {
		return err
	}
	// Frequent pings: a permit's verified window (see advSemW.round)
	// grows with each, its holds are short.
	lk, err := advisory.New(pool, advisory.Config{PingInterval: 20 * time.Millisecond})
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = lk.Close(cctx)
	}()
	asem, err := lk.Semaphore(advSemName, semLimit)
	if err != nil {
		return err
	}
	return clients(ctx, func(id int64) {
		if id%2 == 1 {
			a := &advSemW{rec: rec, sem: asem, id: id}
			for ctx.Err() == nil {
				a.round(ctx)
			}
			return
		}
		w := &semW{lw: &leaseW{rec: rec, pool: pool, store: store, id: id}, sem: sem}
		for ctx.Err() == nil {
			w.round(ctx)
		}
	})
}

// semW is a client of the lease semaphore.
type semW struct {
	lw  *leaseW // its recorder, pool and values written
	sem *lease.Semaphore
}

// waitCtx is the random deadline of a blocking acquisition: from
// shorter than a round trip under load to a couple of seconds.
func waitCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), time.Duration(50+rand.N(2000))*time.Millisecond)
}

// round is one acquisition of 1 or 2 permits and, when it succeeds, a
// tenure: guarded writes per permit, trust checks, then a release, or
// abandonment to expiry.
func (w *semW) round(ctx context.Context) {
	if rand.N(6) == 0 && os.Getenv(envNoReads) == "" {
		w.lw.read(ctx, semSlot(semName, rand.N(semLimit)))
	}
	p := w.acquire(ctx, 1+rand.N(2))
	if p == nil {
		pause(ctx, 10*time.Millisecond)
		return
	}
	for range 1 + rand.N(3) {
		if ctx.Err() != nil || !w.trusted(p) {
			break
		}
		for _, l := range p.Leases() {
			w.lw.write(ctx, l)
		}
		if rand.N(20) == 0 { // overstay: the TTL may pass, others may take the slots
			pause(ctx, p.Leases()[0].TTL())
		}
	}
	w.trusted(p)
	if rand.N(6) == 0 {
		return // abandoned: the rows expire
	}
	w.release(ctx, p)
}

// acquire records and makes one acquisition of n permits. The model
// sees it as one acquire per slot below the limit, called together:
// each granted slot's returns ok with its token, the others busy (the
// acquisition did not touch them); a refused acquisition is busy on
// every slot, an unknown one unknown on every slot (it may have taken
// any of them), as is one whose process was killed before it returned.
func (w *semW) acquire(ctx context.Context, n int) *lease.Permits {
	rec := w.lw.rec
	whole := rec.call(opPermits, semName, 0, int64(n))
	ids := make([]int64, semLimit)
	for i := range ids {
		ids[i] = rec.call(opAcquire, semSlot(semName, i), 0, 0)
	}
	ttl := time.Duration(800+rand.N(1700)) * time.Millisecond
	var opts []lease.Option
	if rand.N(2) == 0 {
		opts = append(opts, lease.WithKeepAlive())
	}
	var p *lease.Permits
	var err error
	if rand.N(2) == 0 {
		octx, cancel := waitCtx(ctx)
		p, err = w.sem.Acquire(octx, n, ttl, opts...)
		cancel()
	} else {
		octx, cancel := opCtx(ctx)
		p, err = w.sem.TryAcquire(octx, n, ttl, opts...)
		cancel()
	}
	res := resUnknown
	switch {
	case err == nil:
		res = resOK
	case errors.Is(err, lease.ErrHeld):
		res = resBusy
	}
	got := map[string]int64{}
	if p != nil {
		for _, l := range p.Leases() {
			got[l.Name()] = l.Token()
		}
	}
	for i, id := range ids {
		switch tok, ok := got[semSlot(semName, i)]; {
		case ok:
			rec.ret(id, resOK, tok, 0)
		case res == resOK:
			rec.ret(id, resBusy, 0, 0)
		default:
			rec.ret(id, res, 0, 0)
		}
	}
	rec.write(event{K: evRet, I: whole, Op: opPermits, Res: res, Val: int64(len(got)), T: mono()})
	if len(got) != p.N() {
		rec.note("permits outside slots 0..%d: %v", semLimit-1, p.Tokens())
	}
	return p
}

// trusted checks, and records per permit, that every permit is still
// held: the Permits' and the lease's Context live, the lease's trust
// deadline ahead.
func (w *semW) trusted(p *lease.Permits) bool {
	all := true
	for _, l := range p.Leases() {
		all = w.lw.rec.trust(l.Name(), l.Token(), func() bool {
			return p.Context().Err() == nil && l.Context().Err() == nil && time.Now().Before(l.TrustedUntil())
		}) && all
	}
	return all
}

// release records a release per permit, all with the outcome of the one
// Permits.Release: ok if it returned nil, else unknown (it ends every
// lease whatever the outcome, so it is not retried). After a release, a
// stale write now and then: the guard must refuse it.
func (w *semW) release(ctx context.Context, p *lease.Permits) {
	rec := w.lw.rec
	ls := p.Leases()
	ids := make([]int64, len(ls))
	for i, l := range ls {
		ids[i] = rec.call(opRelease, l.Name(), l.Token(), 0)
	}
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(100+rand.N(200))*time.Millisecond)
	err := p.Release(octx)
	cancel()
	res := resOK
	if err != nil {
		res = resUnknown
	}
	for _, id := range ids {
		rec.ret(id, res, 0, 0)
	}
	if err == nil && rand.N(4) == 0 && os.Getenv(envNoWrites) == "" {
		w.lw.write(ctx, ls[rand.N(len(ls))])
	}
}

// advSemW is a client of the advisory semaphore.
type advSemW struct {
	rec *recorder
	sem *advisory.Semaphore
	id  int64
	n   int64
}

// round takes 1 or 2 permits, reports each permit's verified window
// (from the reply that granted it to the send time of the latest round
// trip the server answered on its session) a few times, and releases.
func (a *advSemW) round(ctx context.Context) {
	n := 1 + rand.N(2)
	id := a.rec.call(opAdvPermits, advSemName, 0, int64(n))
	var p *advisory.Permits
	var err error
	if rand.N(2) == 0 {
		octx, cancel := waitCtx(ctx)
		p, err = a.sem.Acquire(octx, n)
		cancel()
	} else {
		octx, cancel := opCtx(ctx)
		p, err = a.sem.TryAcquire(octx, n)
		cancel()
	}
	granted := mono()
	switch {
	case err == nil:
		a.n++
		a.rec.ret(id, resOK, a.rec.acqID(a.id, a.n), int64(p.N()))
	case errors.Is(err, advisory.ErrLocked):
		a.rec.ret(id, resBusy, 0, 0)
		pause(ctx, 5*time.Millisecond)
		return
	default:
		a.rec.ret(id, resUnknown, 0, 0)
		pause(ctx, 20*time.Millisecond)
		return
	}
	a.hold(ctx, p, a.rec.acqID(a.id, a.n), granted)
}

func (a *advSemW) hold(ctx context.Context, p *advisory.Permits, acq, granted int64) {
	for range 1 + rand.N(4) {
		pause(ctx, time.Duration(rand.N(60))*time.Millisecond)
		if p.Err() != nil {
			break
		}
		verified := mono() - time.Since(p.VerifiedAt()).Nanoseconds()
		for _, s := range p.Slots() {
			a.rec.write(event{K: evTrust, Name: semSlot(advSemName, s), Tok: acq, T: verified, To: granted})
		}
	}
	id := a.rec.call(opAdvRelease, advSemName, acq, 0)
	octx, cancel := opCtx(ctx)
	err := p.Release(octx)
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

// semSlotOf returns the semaphore of a slot name ("s#2" → "s"), or ""
// for a name that is no slot.
func semSlotOf(name string) string {
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '#' {
			if _, err := strconv.Atoi(name[i+1:]); err == nil && i > 0 {
				return name[:i]
			}
			return ""
		}
	}
	return ""
}
