package lease

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// Lock order: a Lease's mu before renewer.mu; renewer.mu is never held
// while taking a Lease's.
//
// renewer renews every kept-alive lease of a store, in one statement (and
// one commit, one WAL flush) per round rather than one per lease: when a
// lease is due, every lease due within the next half of its renewal
// interval is renewed with it, so that leases of one TTL fall into step
// and 10,000 of them cost one statement per interval. Between renewals, a
// lease's row is checked every Config.CheckInterval, also in batches. A
// lease the batch did not renew — not held any more, or its row locked by
// a Guard, which the batch skips rather than waits for — is renewed on its
// own, which tells the two apart. After a failed batch its leases retry
// with backoff for as long as they are trusted; the trust timer declares
// a loss if no renewal succeeds in time. It starts with the store's first
// kept-alive lease and runs until Close.
type renewer struct {
	s    *Store
	mu   sync.Mutex
	set  map[*Lease]*keepAlive
	kick chan struct{}
}

// keepAlive hands l to the store's renewer, starting it on first use. The
// caller must be inside enter/exit.
func (s *Store) keepAlive(l *Lease, ka *keepAlive) {
	s.mu.Lock()
	if s.ctx.Err() != nil {
		s.mu.Unlock()
		ka.finish()
		return
	}
	if s.ren == nil {
		s.ren = &renewer{s: s, set: make(map[*Lease]*keepAlive), kick: make(chan struct{}, 1)}
		s.wg.Add(1)
		go s.ren.run(s.ctx)
	}
	r := s.ren
	s.mu.Unlock()
	r.mu.Lock()
	r.set[l] = ka
	r.mu.Unlock()
	poke(r.kick)
}

// kickRenewer makes the renewer look at its leases now (one has ended).
func (s *Store) kickRenewer() {
	s.mu.Lock()
	r := s.ren
	s.mu.Unlock()
	if r != nil {
		poke(r.kick)
	}
}

func (r *renewer) run(ctx context.Context) {
	defer r.s.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		t.Reset(r.round(ctx))
		select {
		case <-ctx.Done():
			r.mu.Lock()
			for _, ka := range r.set {
				ka.finish()
			}
			clear(r.set)
			r.mu.Unlock()
			return
		case <-r.kick:
		case <-t.C:
		}
	}
}

// round lets go of ended leases, runs the renewals and checks that are
// due, and returns how long to wait for the next.
func (r *renewer) round(ctx context.Context) time.Duration {
	now := r.s.cfg.Now()
	ci := r.s.cfg.CheckInterval
	var renew, check []entry
	renewDue, checkDue := false, false
	next := 24 * time.Hour
	r.mu.Lock()
	for l, ka := range r.set {
		switch {
		case ka.stopped() && !ka.fallback:
			delete(r.set, l)
			ka.finish()
		case ka.fallback || ka.stopped():
		default:
			renewDue = renewDue || !ka.due.After(now)
			checkDue = checkDue || !ka.contact.Add(ci).After(now)
			next = min(next, ka.due.Sub(now), ka.contact.Add(ci).Sub(now))
		}
	}
	for l, ka := range r.set {
		if ka.fallback || ka.stopped() {
			continue
		}
		if renewDue && !ka.due.After(now.Add(ka.interval/2)) {
			renew = append(renew, entry{l, ka})
		} else if checkDue && !ka.contact.Add(ci).After(now.Add(ci/2)) {
			check = append(check, entry{l, ka})
		}
	}
	r.mu.Unlock()
	if len(renew) == 0 && len(check) == 0 {
		return max(next, 0)
	}
	if len(renew) > 0 {
		r.renewBatch(ctx, renew, now)
	}
	if len(check) > 0 {
		r.checkBatch(ctx, check, now)
	}
	return 0
}

// batchArgs are the (name, owner, token) arrays of leases, and the
// latest trust deadline among them, which bounds their statement.
func batchArgs(ls []*Lease) (names []string, owners []pgtype.UUID, tokens []int64, until time.Time) {
	for _, l := range ls {
		names = append(names, l.name)
		owners = append(owners, pgUUID(l.owner))
		tokens = append(tokens, l.token)
		if t := l.TrustedUntil(); t.After(until) {
			until = t
		}
	}
	return names, owners, tokens, until
}

type leaseKey struct {
	name  string
	token int64
}

// entry is a lease of the renewer's set with its keep-alive, as the set
// held them when a round began (a lease's own ka field is its, under l.mu).
type entry struct {
	l  *Lease
	ka *keepAlive
}

// renewBatch renews es in one statement.
func (r *renewer) renewBatch(ctx context.Context, es []entry, now time.Time) {
	s := r.s
	// A lease past its trust deadline is not renewed: its trust timer
	// declares the loss (and the keep-alive lets go of it then).
	var late []entry
	es = slices.DeleteFunc(es, func(e entry) bool {
		if e.l.TrustedUntil().After(now) {
			return false
		}
		late = append(late, e)
		return true
	})
	r.mu.Lock()
	for _, e := range late {
		e.ka.due = now.Add(e.ka.interval)
	}
	every := time.Duration(0)
	for i, e := range es {
		if i == 0 || e.ka.interval < every {
			every = e.ka.interval
		}
	}
	r.mu.Unlock()
	if len(es) == 0 {
		return
	}
	ls := leases(es)
	names, owners, tokens, until := batchArgs(ls)
	// Bounded by the latest trust deadline, and by the shortest interval:
	// a hung connection is given up in time for another try.
	sctx, cancel := context.WithTimeout(ctx, max(min(until.Sub(now), every), time.Millisecond))
	defer cancel()
	type result struct {
		exp time.Time
		lag time.Duration
	}
	got := make(map[leaseKey]result, len(ls))
	var sent time.Time
	err := retrySerialization(sctx, func() error {
		clear(got)
		sent = s.cfg.Now()
		rows, err := s.pool.Query(sctx, s.q.renewManySQL, names, owners, tokens)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				k   leaseKey
				res result
				us  int64
			)
			if err := rows.Scan(&k.name, &k.token, &res.exp, &us); err != nil {
				return err
			}
			res.lag = time.Duration(us) * time.Microsecond
			got[k] = res
		}
		return rows.Err()
	})
	if err == nil {
		err = ackedLate(sctx)
	}
	for _, l := range ls { // not under r.mu: l.mu comes first
		res, ok := got[leaseKey{l.name, l.token}]
		switch {
		case err != nil:
			l.observeRenew(sent, err) // retried with backoff
		case ok:
			l.observeRenew(sent, l.renewed(sent, res.exp, res.lag))
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range es {
		l, ka := e.l, e.ka
		_, ok := got[leaseKey{l.name, l.token}]
		switch {
		case err != nil:
			minBackoff := max(ka.interval/16, time.Millisecond)
			ka.backoff = min(max(2*ka.backoff, minBackoff), ka.interval)
			ka.due = now.Add(ka.backoff)
		case ok:
			ka.due, ka.contact, ka.backoff = now.Add(ka.interval), now, 0
		default:
			ka.fallback = true
			s.wg.Add(1)
			go r.renewAlone(l, ka)
		}
	}
}

// renewAlone renews one lease the batch did not: it waits for a Guard's
// row lock, or finds the lease not held (and the lease is then lost).
func (r *renewer) renewAlone(l *Lease, ka *keepAlive) {
	defer r.s.wg.Done()
	now := r.s.cfg.Now()
	ctx, cancel := context.WithTimeout(r.s.ctx, max(l.TrustedUntil().Sub(now), time.Millisecond))
	err := l.renew(ctx)
	cancel()
	r.mu.Lock()
	ka.fallback = false
	switch {
	case err == nil:
		ka.due, ka.contact, ka.backoff = now.Add(ka.interval), now, 0
	case errors.Is(err, ErrNotHeld), errors.Is(err, ErrClosed):
		ka.signalStop()
	default:
		ka.backoff = min(max(2*ka.backoff, max(ka.interval/16, time.Millisecond)), ka.interval)
		ka.due = now.Add(ka.backoff)
	}
	r.mu.Unlock()
	poke(r.kick)
}

// checkBatch checks in one statement that ls still hold their leases; a
// lease that does not is lost. A failed check is tried again at the next
// check interval (renewals go on meanwhile).
func (r *renewer) checkBatch(ctx context.Context, es []entry, now time.Time) {
	s := r.s
	ls := leases(es)
	names, owners, tokens, until := batchArgs(ls)
	sctx, cancel := context.WithTimeout(ctx, max(min(until.Sub(now), s.cfg.CheckInterval), time.Millisecond))
	defer cancel()
	held := make(map[leaseKey]bool, len(ls))
	rows, err := s.pool.Query(sctx, s.q.checkManySQL, names, owners, tokens)
	if err == nil {
		for rows.Next() {
			var k leaseKey
			if err = rows.Scan(&k.name, &k.token); err != nil {
				break
			}
			held[k] = true
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	for _, l := range ls {
		if err == nil && !held[leaseKey{l.name, l.token}] {
			l.notHeld("check")
		}
	}
	r.mu.Lock()
	for _, e := range es {
		e.ka.contact = now
	}
	r.mu.Unlock()
}

// leases returns the leases of es.
func leases(es []entry) []*Lease {
	ls := make([]*Lease, len(es))
	for i, e := range es {
		ls[i] = e.l
	}
	return ls
}
