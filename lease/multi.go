package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
)

// MaxAcquireAll is the most names one [Store.TryAcquireAll] or
// [Store.AcquireAll] takes: one statement locks at most this many rows.
const MaxAcquireAll = 64

// HeldAllError is the error of a [Store.TryAcquireAll] that found some of
// its names held: nothing was taken. errors.Is(err, ErrHeld) reports true
// for it, and errors.As finds a [*HeldError] (the first of Held).
type HeldAllError struct {
	// Held are the holders of the names that were held when the try ran,
	// in name order; the other names were free.
	Held []HeldError
}

// Error lists the names held.
func (e *HeldAllError) Error() string {
	if e == nil {
		return "lease: nil *HeldAllError"
	}
	parts := make([]string, len(e.Held))
	for i := range e.Held {
		parts[i] = e.Held[i].Error()
	}
	return fmt.Sprintf("lease: %d of the names held, none taken: %s", len(e.Held), strings.Join(parts, "; "))
}

// Is reports whether target is [ErrHeld].
func (e *HeldAllError) Is(target error) bool { return target == ErrHeld }

// Unwrap returns the holders as [*HeldError] values.
func (e *HeldAllError) Unwrap() []error {
	if e == nil {
		return nil
	}
	errs := make([]error, len(e.Held))
	for i := range e.Held {
		errs[i] = &e.Held[i]
	}
	return errs
}

// locked reports whether some names of e were not held but locked.
func (e *HeldAllError) locked() bool {
	return slices.ContainsFunc(e.Held, func(h HeldError) bool { return h.Locked })
}

// soonest is the shortest time any holder of e had left (0 when none was
// held: only locked).
func (e *HeldAllError) soonest() time.Duration {
	d := time.Duration(-1)
	for _, h := range e.Held {
		if h.Locked {
			continue
		}
		if d < 0 || h.ExpiresIn < d {
			d = h.ExpiresIn
		}
	}
	return max(d, 0)
}

// TryAcquireAll acquires every lease of names for ttl, or none: in one
// statement and one round trip, each name gets its own [Lease] and token
// (its previous token + 1), which renews, releases, fences and keeps
// alive ([WithKeepAlive]) like any other. The leases are returned in the
// order of names, and share one owner (a fresh one, or [WithOwner]'s).
//
// If any name is held, the error is a [*HeldAllError] listing the
// holders (errors.Is ErrHeld); such a try takes no row lock and writes
// nothing. The statement never waits for a row lock: two calls over
// overlapping sets, in any order, cannot deadlock, and a row another
// statement has locked at that moment (a racing acquisition, a Guard)
// makes the statement take nothing and run again with a short backoff;
// after a few such races the names whose rows stay locked are reported
// as a HeldAllError too, each [HeldError] with Locked set. The one wait
// it has: inserting a name that has no row yet waits for another
// transaction's uncommitted insert of the same name, and then fails and
// runs again if that one commits. If the outcome is unknown (the reply was lost, ctx ended
// while the statement ran), the error says so and every name is cleaned
// up in the background by the attempt's id, as [Store.TryAcquire] does
// for one name.
//
// names must hold 1 to [MaxAcquireAll] distinct valid names; ttl is
// checked as for TryAcquire. The Observer sees one Acquire event per
// name, each with the call's result and duration, and one Start per
// lease. ctx bounds the call.
func (s *Store) TryAcquireAll(ctx context.Context, names []string, ttl time.Duration, opts ...Option) ([]*Lease, error) {
	sorted, o, err := s.checkAll(ctx, names, ttl, opts)
	if err != nil {
		return nil, fmt.Errorf("try acquire leases: %w", err)
	}
	start := s.cfg.Now()
	ls, err := s.tryAll(ctx, sorted, ttl, o)
	if err != nil {
		err = fmt.Errorf("try acquire leases %s: %w", shortNames(names), err)
	}
	return s.observeAll(names, false, start, ls, err)
}

// AcquireAll acquires every lease of names for ttl, or none, waiting
// while any is held, until it takes them all or ctx ends. Each try is
// that of [Store.TryAcquireAll]; between tries it waits as [Store.Acquire]
// does — a release of any of the names wakes it at once (LISTEN/NOTIFY),
// a holder that vanished is noticed at the soonest expiry the failed try
// reported, transient errors are retried with capped, jittered backoff.
// It takes every name in one statement, so it holds nothing while it
// waits and cannot deadlock with other callers. It does not queue with
// the store's Acquire calls of single names: a stream of them can keep
// one of the names busy indefinitely (a semaphore's turn, see
// [Semaphore.Acquire], is the fair form). A cancelled wait leaves no row
// owned.
func (s *Store) AcquireAll(ctx context.Context, names []string, ttl time.Duration, opts ...Option) ([]*Lease, error) {
	sorted, o, err := s.checkAll(ctx, names, ttl, opts)
	if err != nil {
		return nil, fmt.Errorf("acquire leases: %w", err)
	}
	start := s.cfg.Now()
	var ls []*Lease
	err = s.await(ctx, func(ctx context.Context) (busy, error) {
		var err error
		ls, err = s.tryAll(ctx, sorted, ttl, o)
		var held *HeldAllError
		if errors.As(err, &held) {
			watch := make([]string, len(held.Held))
			for i, h := range held.Held {
				watch[i] = h.Name
			}
			return busy{watch: watch, wait: held.soonest(), locked: held.locked()}, err
		}
		return busy{}, err
	})
	if err != nil {
		err = fmt.Errorf("acquire leases %s: %w", shortNames(names), err)
	}
	return s.observeAll(names, true, start, ls, err)
}

// tryAll is TryAcquireAll after its input checks, names sorted; the
// leases come back in name order.
func (s *Store) tryAll(ctx context.Context, names []string, ttl time.Duration, o options) ([]*Lease, error) {
	ls, res, err := s.tryMulti(ctx, names, ttl, o, func(ctx context.Context, db querier, attempt uuid.UUID) (multiResult, error) {
		return s.acquireAll(ctx, db, names, attempt, o, ttl)
	})
	switch {
	case err != nil:
		return nil, err
	case len(res.held) > 0:
		slices.SortFunc(res.held, func(a, b HeldError) int { return strings.Compare(a.Name, b.Name) })
		return nil, &HeldAllError{Held: res.held}
	case len(res.lost) > 0:
		slices.SortFunc(res.lost, func(a, b HeldError) int { return strings.Compare(a.Name, b.Name) })
		return nil, &HeldAllError{Held: res.lost}
	}
	slices.SortFunc(ls, func(a, b *Lease) int { return strings.Compare(a.name, b.name) })
	return ls, nil
}

// checkAll validates the arguments of TryAcquireAll and AcquireAll and
// returns the names sorted (the order rows are locked in).
func (s *Store) checkAll(ctx context.Context, names []string, ttl time.Duration, opts []Option) ([]string, options, error) {
	switch {
	case len(names) == 0:
		return nil, options{}, errors.New("lease: no names: the set to acquire is empty")
	case len(names) > MaxAcquireAll:
		return nil, options{}, fmt.Errorf("lease: %d names, more than lease.MaxAcquireAll (%d)", len(names), MaxAcquireAll)
	}
	for i, name := range names {
		if err := checkName(name); err != nil {
			return nil, options{}, fmt.Errorf("name %d (%q): %w", i, short(name), err)
		}
	}
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return nil, options{}, fmt.Errorf("lease: name %q appears twice in the set", short(sorted[i]))
		}
	}
	o, err := s.check(ctx, sorted[0], ttl, opts)
	return sorted, o, err
}

// inOrder returns ls (in name order) in the order of names.
func inOrder(names []string, ls []*Lease) []*Lease {
	out := make([]*Lease, 0, len(ls))
	for _, name := range names {
		i, found := slices.BinarySearchFunc(ls, name, func(l *Lease, n string) int { return strings.Compare(l.name, n) })
		if found {
			out = append(out, ls[i])
		}
	}
	return out
}

// observeAll reports an AcquireAll or TryAcquireAll call: one Acquire
// event per name, with the call's result. It returns the leases in the
// order of names.
func (s *Store) observeAll(names []string, wait bool, start time.Time, ls []*Lease, err error) ([]*Lease, error) {
	if err != nil {
		for _, name := range names {
			s.observeAcquire(name, wait, start, nil, err)
		}
		return nil, err
	}
	ls = inOrder(names, ls)
	for _, l := range ls {
		s.observeAcquire(l.name, wait, start, l, nil)
	}
	return ls, nil
}

// shortNames names a set in an error: its first names, and how many more.
func shortNames(names []string) string {
	const show = 3
	parts := make([]string, 0, show)
	for _, n := range names[:min(len(names), show)] {
		parts = append(parts, fmt.Sprintf("%q", short(n)))
	}
	if len(names) > show {
		parts = append(parts, fmt.Sprintf("and %d more", len(names)-show))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}
