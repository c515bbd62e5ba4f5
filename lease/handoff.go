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
// again, and Resume takes it, with no other holder. The original [Lease]
// value, if any, is not told: the two are the same lease, and either may
// release it. Options other than [WithKeepAlive] are ignored. ctx bounds the
// round trip.
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
	return s.newLease(ctx, h.Name, h.Owner, h.Token, ttl, exp, start, o.keepAlive, false)
}
