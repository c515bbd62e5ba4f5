package leader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/pglocks/pglocks/lease"
)

// MaxValueLen bounds a candidate's and a leader's value (Config.Value,
// [Term.Proclaim]), in bytes: it is stored in the lease rows' metadata,
// read by every observer on every change.
const MaxValueLen = 8 << 10

// publisher is what a term publishes in its lease row: the metadata,
// changed by Proclaim and by a hand-over's reservation.
type publisher struct {
	e  *Elector
	mu sync.Mutex
	m  meta
}

// set writes m to the term's lease row and, done, keeps it. Calls are
// serialized, so the row shows the last one answered.
func (p *publisher) set(ctx context.Context, ls *lease.Lease, change func(*meta)) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.m
	change(&m)
	md, _ := json.Marshal(m)
	if err := ls.SetMetadata(ctx, md); err != nil {
		return err
	}
	p.m = m
	return nil
}

func (p *publisher) value() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m.Value
}

// Value returns the value this term publishes ([Leader].Value): the
// elector's Config.Value, or the last one proclaimed. The zero Term's is
// empty.
func (t Term) Value() string {
	if t.pub == nil {
		return ""
	}
	return t.pub.value()
}

// Proclaim publishes value with this term, without a new election (etcd's
// Proclaim): it replaces the value in the term's lease row, in one
// statement scoped to the term, and notifies observers, whose
// [Elector.Observe] delivers the new [Leader]. The elector's candidate row
// and its later terms carry the new value too. value is at most
// [MaxValueLen] bytes of valid UTF-8 without NUL (refused before any
// round trip: jsonb cannot store it). It returns an error wrapping
// [lease.ErrNotHeld] once the term is over (the zero Term too); any other
// error is an unknown outcome — the row may show the old value or the new
// one — and leaves the term as it was. ctx bounds the round trips: the
// term row's update, then (best effort, 5s at most) the candidate row's
// and the notification. Proclaim waits for a [Term.Guard] transaction of
// the same term that is open on the row (its FOR SHARE lock): do not call
// it from inside one, nor while one is held open elsewhere for long.
func (t Term) Proclaim(ctx context.Context, value string) error {
	switch {
	case t.pub == nil || t.lease == nil:
		return fmt.Errorf("leader: proclaim: the zero Term is no term: %w", lease.ErrNotHeld)
	case ctx == nil:
		return fmt.Errorf("leader: proclaim in %q: nil context", t.Election)
	case checkValue(value) != nil:
		return fmt.Errorf("leader: proclaim in %q: value: %w", t.Election, checkValue(value))
	case t.Context().Err() != nil:
		return fmt.Errorf("leader: proclaim in %q: term %d is over: %w", t.Election, t.Number, lease.ErrNotHeld)
	}
	if err := t.pub.set(ctx, t.lease, func(m *meta) { m.Value = value }); err != nil {
		return fmt.Errorf("leader: proclaim in %q, term %d: %w", t.Election, t.Number, err)
	}
	e := t.pub.e
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	e.setValue(ctx, value)
	e.announce(ctx)
	return nil
}

// checkValue checks a candidate's or a leader's value: at most
// MaxValueLen bytes of valid UTF-8 without NUL, which jsonb cannot hold.
func checkValue(v string) error {
	switch {
	case len(v) > MaxValueLen:
		return fmt.Errorf("%d bytes, more than %d", len(v), MaxValueLen)
	case !utf8.ValidString(v):
		return errors.New("not valid UTF-8")
	case strings.IndexByte(v, 0) >= 0:
		return errors.New("holds a NUL character, which PostgreSQL's jsonb cannot store")
	}
	return nil
}

// value is the value this elector publishes.
func (e *Elector) value() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.val
}

// setValue records value for later terms and in the candidate row (best
// effort, bounded by ctx: a failure is logged, and a candidate row taken
// again carries it).
func (e *Elector) setValue(ctx context.Context, value string) {
	e.mu.Lock()
	e.val = value
	c := e.cand
	e.mu.Unlock()
	if c == nil {
		return
	}
	md, _ := json.Marshal(candidateMeta{Election: e.cfg.Name, Identity: e.cfg.Identity, Value: value})
	if err := c.SetMetadata(ctx, md); err != nil {
		e.cfg.Logger.Debug("leader: set value in candidate row", "election", e.cfg.Name, "err", err)
	}
}
