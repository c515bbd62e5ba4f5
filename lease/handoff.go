package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Handle names one acquisition of a lease — (name, owner, token) — so that
// another process can resume it with [Store.Resume]: an API process
// acquires a lease and puts its Handle in a queue job; the worker resumes
// the lease, works under it and releases it.
//
// Its text form (MarshalText, also used by encoding/json, which writes it
// as a JSON string) is compact and unambiguous for any name:
//
//	v1:42:6f1c2a8e-9d3b-4c71-a0e5-1b2c3d4e5f60:report:monthly
//
// A Handle is a capability: whoever has it can renew and release the lease.
type Handle struct {
	// Name is the lease's name.
	Name string
	// Owner is the owner id the lease was acquired with.
	Owner uuid.UUID
	// Token is the acquisition's fencing token.
	Token int64
}

const handlePrefix = "v1:"

// String returns the text form of h.
func (h Handle) String() string {
	return handlePrefix + strconv.FormatInt(h.Token, 10) + ":" + h.Owner.String() + ":" + h.Name
}

// MarshalText returns the text form of h.
func (h Handle) MarshalText() ([]byte, error) {
	if err := h.validate(); err != nil {
		return nil, err
	}
	return []byte(h.String()), nil
}

// UnmarshalText parses the text form made by [Handle.MarshalText].
func (h *Handle) UnmarshalText(text []byte) error {
	if h == nil {
		return errors.New("lease: parse handle: nil *Handle")
	}
	s, ok := strings.CutPrefix(string(text), handlePrefix)
	if !ok {
		return fmt.Errorf("lease: parse handle: missing %q prefix", handlePrefix)
	}
	tok, rest, ok := strings.Cut(s, ":")
	if !ok || len(rest) < 37 || rest[36] != ':' {
		return errors.New("lease: parse handle: want v1:<token>:<owner uuid>:<name>")
	}
	token, err := strconv.ParseInt(tok, 10, 64)
	if err != nil {
		return fmt.Errorf("lease: parse handle: token: %w", err)
	}
	owner, err := uuid.Parse(rest[:36])
	if err != nil {
		return fmt.Errorf("lease: parse handle: owner: %w", err)
	}
	v := Handle{Name: rest[37:], Owner: owner, Token: token}
	if err := v.validate(); err != nil {
		return err
	}
	*h = v
	return nil
}

func (h Handle) validate() error {
	if err := checkName(h.Name); err != nil {
		return fmt.Errorf("lease: handle: %w", err)
	}
	if h.Token <= 0 {
		return fmt.Errorf("lease: handle %q: token %d is not positive", h.Name, h.Token)
	}
	return nil
}

// ParseHandle parses the text form of a [Handle].
func ParseHandle(s string) (Handle, error) {
	var h Handle
	err := h.UnmarshalText([]byte(s))
	return h, err
}

// Resume takes over, in this process, the lease acquired elsewhere that h
// names: it renews it for its TTL (one round trip) and returns it, live,
// with a fresh trust deadline. If that acquisition no longer holds the lease
// the error wraps [ErrNotHeld] — unless a crash lost its acknowledged
// release (see [Lease.Release]): until its expiry, the row shows it held
// again, and Resume takes it, with no other holder. Options other than
// [WithKeepAlive] are ignored. ctx bounds the round trip.
//
// A store keeps one Lease per acquisition: if it holds the acquisition h
// names as a live Lease already (h came from one of its own Leases), Resume
// renews that Lease and returns it — WithKeepAlive starts its keep-alive if
// it has none — so a Release through any reference ends it for every one
// (TestResumeLiveLease). An acquisition whose release this store runs in
// the background (a Release that was not sent or whose outcome is unknown)
// is refused with ErrNotHeld (TestResumeWhileReleasing). Another store or
// process is not told: a Lease value there and the one Resume returns are
// the same lease, either may release it, and the other then learns it only
// when it next asks the server (its keep-alive's check, Renew, Guard) or
// at its trust deadline. Do not resume a Handle whose Lease was released.
func (s *Store) Resume(ctx context.Context, h Handle, opts ...Option) (*Lease, error) {
	l, err := s.resume(ctx, h, opts)
	if err != nil {
		return nil, fmt.Errorf("resume lease %q: %w", short(h.Name), err)
	}
	return l, nil
}

func (s *Store) resume(ctx context.Context, h Handle, opts []Option) (*Lease, error) {
	o := applyOptions(opts)
	if err := checkCtx(ctx); err != nil {
		return nil, err
	}
	if err := o.checkMaxHold(); err != nil {
		return nil, err
	}
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	if err := h.validate(); err != nil {
		return nil, err
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.exit()
	if l := s.liveLease(h); l != nil {
		if err := l.resumeLive(ctx, o); err != nil {
			return nil, err
		}
		return l, nil
	}
	if s.isReleasing(h) {
		return nil, fmt.Errorf("%w: this store is releasing that acquisition in the background", ErrNotHeld)
	}
	var (
		sent       time.Time
		exp        time.Time
		ttlUS, lag int64
	)
	err := retrySerialization(ctx, func() error {
		sent = s.cfg.Now()
		return noRows(s.pool.QueryRow(ctx, s.q.resumeSQL, h.Name, pgUUID(h.Owner), h.Token).Scan(&exp, &ttlUS, &lag))
	})
	if err == nil {
		err = ackedLate(ctx)
	}
	if err != nil {
		return nil, err
	}
	ttl := time.Duration(ttlUS) * time.Microsecond
	if o.keepAlive {
		if err := s.checkKeepAlive(ttl); err != nil {
			return nil, err
		}
	}
	start := trustStart(sent, time.Duration(lag)*time.Microsecond, s.cfg.Now())
	return s.newLease(ctx, h.Name, h.Owner, h.Token, ttl, exp, start, o, false)
}

// resumeLive is Resume of an acquisition this store holds as the live
// Lease l: it renews l and, with WithKeepAlive, starts l's keep-alive if it
// has none. The caller is inside enter/exit.
func (l *Lease) resumeLive(ctx context.Context, o options) error {
	if o.keepAlive {
		if err := l.store.checkKeepAlive(l.ttl); err != nil {
			return err
		}
	}
	if err := l.renew(ctx); err != nil {
		return err
	}
	if !o.keepAlive {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.ended:
		return l.endedErr()
	case l.ka == nil && !l.releasing:
		l.startKeepAlive()
	}
	return nil
}
