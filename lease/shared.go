package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglocks/pglocks"
)

// TryAcquireShared acquires a reader's hold of the shared lease rw for ttl
// if no writer holds rw or waits for it, in three round trips: a read of
// rw's writer and of a free reader slot, the acquisition of that slot's
// row (as [Store.TryAcquire] does), and a second read of the writer. Many
// readers hold rw at once; a writer ([Store.TryAcquireExclusive],
// [Store.AcquireExclusive]) excludes them. The reader's hold is an
// ordinary [*Lease] on its slot's row, named rw + "#r." + a number: it
// renews, keeps alive, is lost and released as any lease, and its token
// means nothing to other readers. Options are those of TryAcquire.
//
// A writer found in the first read gives a [*HeldError] (errors.Is
// ErrHeld) naming the writer's row, rw + "#w", and nothing is written. A
// writer that took its row between the first and the second read (see the
// package doc, Shared leases) makes the reader give its slot back —
// released at once, or in the background if that release's outcome is
// unknown — and the same HeldError is returned; so is an error of the
// second read, after the slot was given back. ctx bounds the call.
func (s *Store) TryAcquireShared(ctx context.Context, rw string, ttl time.Duration, opts ...Option) (*Lease, error) {
	o, err := s.checkShared(ctx, rw, ttl, opts)
	if err != nil {
		return nil, fmt.Errorf("try acquire shared lease %q: %w", short(rw), err)
	}
	start := s.cfg.Now()
	l, err := s.tryShared(ctx, rw, ttl, o)
	return s.observeAcquire(rw, false, start, l, wrapShared("try acquire shared", rw, err))
}

// AcquireShared acquires a reader's hold of the shared lease rw for ttl as
// [Store.TryAcquireShared] does, waiting while a writer holds rw or waits
// for it: a release of the writer's row wakes it at once (NOTIFY), a
// vanished writer is noticed at its row's expiry, and errors are retried
// as [Store.Acquire] retries them. The AcquireShared calls of one rw in
// one store queue first come, first served. ctx bounds the whole wait; a
// cancelled wait leaves no row owned.
func (s *Store) AcquireShared(ctx context.Context, rw string, ttl time.Duration, opts ...Option) (*Lease, error) {
	o, err := s.checkShared(ctx, rw, ttl, opts)
	if err != nil {
		return nil, fmt.Errorf("acquire shared lease %q: %w", short(rw), err)
	}
	start := s.cfg.Now()
	l, err := s.acquireBy(ctx, rw+readerSuffix, tryBound(ttl), func(ctx context.Context) (*Lease, error) {
		return s.tryShared(ctx, rw, ttl, o)
	})
	return s.observeAcquire(rw, true, start, l, wrapShared("acquire shared", rw, err))
}

// TryAcquireExclusive acquires the writer's hold of the shared lease rw for
// ttl if no reader and no other writer holds it: a read of the readers,
// the acquisition of the writer's row rw + "#w" (as [Store.TryAcquire]
// does), and a second read of the readers. The Lease is an ordinary lease
// on that row, with a fencing token of its own ([Lease.Guard],
// [Lease.Token]). Readers found by the first read give a [*HeldError]
// naming one of their slots, and nothing is written; another writer, the
// HeldError of its row. A reader that took its slot between the two reads
// makes the writer give its row back (see [Store.TryAcquireShared]).
// ctx bounds the call.
func (s *Store) TryAcquireExclusive(ctx context.Context, rw string, ttl time.Duration, opts ...Option) (*Lease, error) {
	o, err := s.checkShared(ctx, rw, ttl, opts)
	if err != nil {
		return nil, fmt.Errorf("try acquire exclusive lease %q: %w", short(rw), err)
	}
	start := s.cfg.Now()
	l, err := s.tryExclusive(ctx, rw, ttl, o)
	return s.observeAcquire(rw, false, start, l, wrapShared("try acquire exclusive", rw, err))
}

// AcquireExclusive acquires the writer's hold of the shared lease rw for
// ttl, waiting as needed. It first acquires the writer's row rw + "#w" as
// [Store.Acquire] does (waiting for another writer); from then on no new
// reader gets in, and it waits for the readers already in to release
// their slots (woken at once by NOTIFY) or to let them expire, renewing
// the writer's row meanwhile. So a stream of readers cannot starve a
// writer: it waits at most as long as the longest hold among the readers
// that were in when it took its row. It returns the Lease of the writer's
// row once no reader holds rw. ctx bounds the whole wait; if it ends, or
// the writer's row is lost meanwhile, the row is given back and the error
// says why.
func (s *Store) AcquireExclusive(ctx context.Context, rw string, ttl time.Duration, opts ...Option) (*Lease, error) {
	o, err := s.checkShared(ctx, rw, ttl, opts)
	if err != nil {
		return nil, fmt.Errorf("acquire exclusive lease %q: %w", short(rw), err)
	}
	start := s.cfg.Now()
	l, err := s.acquire(ctx, writerName(rw), ttl, o)
	if err == nil {
		l, err = s.drain(ctx, rw, l)
	}
	return s.observeAcquire(rw, true, start, l, wrapShared("acquire exclusive", rw, err))
}

// checkShared checks the arguments of the shared lease calls: those of
// TryAcquire, and a name that leaves room for its rows' suffixes.
func (s *Store) checkShared(ctx context.Context, rw string, ttl time.Duration, opts []Option) (options, error) {
	o, err := s.check(ctx, rw, ttl, opts)
	if err == nil && len(rw) > MaxNameLen-sharedNameRoom {
		err = fmt.Errorf("%w: shared lease name of %d bytes is longer than lease.MaxNameLen − %d (%d): its rows add a suffix",
			pglocks.ErrInvalidKey, len(rw), sharedNameRoom, MaxNameLen-sharedNameRoom)
	}
	return o, err
}

func wrapShared(op, rw string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s lease %q: %w", op, short(rw), err)
}

// tryShared is one try of a reader: see TryAcquireShared. A slot another
// reader took first sends it to look for another, up to 100 times:
// readers racing for a name with no free slot take new slots one by one.
func (s *Store) tryShared(ctx context.Context, rw string, ttl time.Duration, o options) (*Lease, error) {
	for range 100 {
		g, err := s.gate(ctx, rw)
		if err != nil {
			return nil, err
		}
		if g.writer != nil {
			return nil, g.writer
		}
		l, err := s.try(ctx, readerName(rw, g.slot), ttl, o)
		var held *HeldError
		if errors.As(err, &held) {
			continue // another reader took the slot first
		}
		if err != nil {
			return nil, err
		}
		w, err := s.writer(ctx, rw)
		if err != nil || w != nil {
			return nil, giveBack(ctx, l, w, err)
		}
		return l, nil
	}
	return nil, errors.New("lease: other readers took the free slot first 100 times")
}

// tryExclusive is one try of a writer: see TryAcquireExclusive.
func (s *Store) tryExclusive(ctx context.Context, rw string, ttl time.Duration, o options) (*Lease, error) {
	rs, err := s.readers(ctx, rw)
	if err != nil {
		return nil, err
	}
	if len(rs) > 0 {
		return nil, longest(rs)
	}
	l, err := s.try(ctx, writerName(rw), ttl, o)
	if err != nil {
		return nil, err
	}
	if rs, err = s.readers(ctx, rw); err != nil || len(rs) > 0 {
		var held *HeldError
		if len(rs) > 0 {
			held = longest(rs)
		}
		return nil, giveBack(ctx, l, held, err)
	}
	return l, nil
}

// longest returns the hold with the most time left.
func longest(hs []*HeldError) *HeldError {
	h := hs[0]
	for _, x := range hs[1:] {
		if x.ExpiresIn > h.ExpiresIn {
			h = x
		}
	}
	return h
}

// giveBack releases l, taken by a try that cannot keep it — the other
// side holds rw (held) or could not be checked (err) — and returns held
// or err. The release runs on a context detached from ctx, bounded by the
// TTL; whatever its outcome l has ended, and a release whose outcome is
// unknown goes on in the background (see [Lease.Release]).
func giveBack(ctx context.Context, l *Lease, held *HeldError, err error) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.ttl)
	defer cancel()
	rerr := l.Release(rctx)
	switch {
	case held != nil:
		return held
	case rerr != nil && !errors.Is(rerr, ErrReleased):
		return fmt.Errorf("%w (giving back %q: %v)", err, short(l.name), rerr)
	}
	return fmt.Errorf("%w (%q given back)", err, short(l.name))
}
