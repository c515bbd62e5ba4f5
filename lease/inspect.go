package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Info is the state of one lease row, read by [Store.Get] and [Store.List].
// Times are by the server clock.
type Info struct {
	// Name is the lease's name.
	Name string
	// Held reports whether an owner holds the lease unexpired.
	Held bool
	// Owner is the last owner; the zero UUID once released or broken.
	Owner uuid.UUID
	// Token is the last acquisition's fencing token (or Break's).
	Token int64
	// TTL is the last acquisition's time to live.
	TTL time.Duration
	// AcquiredAt, RenewedAt and ExpiresAt are the times of the last
	// acquisition, of its last renewal, and of its expiry (or release).
	AcquiredAt, RenewedAt, ExpiresAt time.Time
	// TimeLeft is how long the lease has left, 0 if not held.
	TimeLeft time.Duration
	// Hostname and PID identify the process that acquired it, as recorded
	// by its store (Config.Hostname, Config.PID).
	Hostname string
	PID      int
	// Metadata is the JSON given with [WithMetadata], if any.
	Metadata json.RawMessage
}

func scanInfo(row pgx.CollectableRow) (Info, error) {
	var (
		i             Info
		owner         pgtype.UUID
		ttlUS, leftUS int64
		host          pgtype.Text
		pid           pgtype.Int4
		meta          []byte
	)
	err := row.Scan(&i.Name, &owner, &i.Token, &ttlUS, &i.AcquiredAt, &i.RenewedAt, &i.ExpiresAt,
		&i.Held, &leftUS, &host, &pid, &meta)
	if owner.Valid {
		i.Owner = owner.Bytes
	}
	i.TTL = time.Duration(ttlUS) * time.Microsecond
	i.TimeLeft = time.Duration(leftUS) * time.Microsecond
	i.Hostname, i.PID = host.String, int(pid.Int32)
	if meta != nil {
		i.Metadata = json.RawMessage(meta)
	}
	return i, err
}

// Get returns the state of the lease name. A name never acquired gives an
// error wrapping [ErrNotFound]. ctx bounds the round trip.
func (s *Store) Get(ctx context.Context, name string) (Info, error) {
	if err := s.checkArgs(ctx, name); err != nil {
		return Info{}, fmt.Errorf("get lease %q: %w", short(name), err)
	}
	rows, _ := s.pool.Query(ctx, s.q.getSQL, name)
	i, err := pgx.CollectExactlyOneRow(rows, scanInfo)
	if errors.Is(err, pgx.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return Info{}, fmt.Errorf("get lease %q: %w", short(name), err)
	}
	s.seen.observe(name, i.Token)
	return i, nil
}

// List returns every lease held now, by name. ctx bounds the query.
func (s *Store) List(ctx context.Context) ([]Info, error) {
	if err := checkCtx(ctx); err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	if err := s.checkOpen(); err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	rows, _ := s.pool.Query(ctx, s.q.listSQL)
	infos, err := pgx.CollectRows(rows, scanInfo)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	return infos, nil
}

// IsHeld reports whether any owner holds the lease name unexpired by the
// server clock. ctx bounds the round trip.
func (s *Store) IsHeld(ctx context.Context, name string) (bool, error) {
	if err := s.checkArgs(ctx, name); err != nil {
		return false, fmt.Errorf("is lease %q held: %w", short(name), err)
	}
	var held bool
	if err := s.pool.QueryRow(ctx, s.q.isHeldSQL, name).Scan(&held); err != nil {
		return false, fmt.Errorf("is lease %q held: %w", short(name), err)
	}
	return held, nil
}

// Break frees the lease name whoever holds it, for operators: it clears
// the owner, ends the lease now and bumps the token, so that the old
// holder's renewals, guarded writes and releases fail with [ErrNotHeld] and
// the next acquisition's token is higher still; waiters are woken, and the
// holder's store, if it listens (every store holding a lease does), ends
// the holder's Lease at once (NOTIFY on Config.Channel). It waits for open
// transactions guarded by the lease ([Lease.Guard]). It returns the new
// token; a name never acquired gives [ErrNotFound]. A serialization
// failure is retried. ctx bounds the call.
func (s *Store) Break(ctx context.Context, name string) (int64, error) {
	if err := s.usable(); err != nil {
		return 0, fmt.Errorf("break lease %q: %w", short(name), err)
	}
	token, err := s.breakRow(ctx, name, s.q.breakSQL)
	if errors.Is(err, pgx.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return 0, fmt.Errorf("break lease %q: %w", short(name), err)
	}
	return token, nil
}

// BreakAcquisition is [Store.Break] for one acquisition: it frees the
// lease name only while the row still shows the acquisition of that owner
// and token, held or expired but not released. A taker that decided to break the holder it
// saw — after waiting out that holder, say — thus never breaks an
// acquisition made meanwhile by someone else. It returns the new token, or
// [ErrNotHeld] when the row no longer shows that acquisition (released,
// broken, taken over, or never there). With an unknown outcome, it broke
// that acquisition or nothing. ctx bounds the call.
func (s *Store) BreakAcquisition(ctx context.Context, name string, owner uuid.UUID, token int64) (int64, error) {
	if err := s.usable(); err != nil {
		return 0, fmt.Errorf("break lease %q token %d of %v: %w", short(name), token, owner, err)
	}
	next, err := s.breakRow(ctx, name, s.q.breakAcqSQL, pgUUID(owner), token)
	if errors.Is(err, pgx.ErrNoRows) {
		err = ErrNotHeld
	}
	if err != nil {
		return 0, fmt.Errorf("break lease %q token %d of %v: %w", short(name), token, owner, err)
	}
	return next, nil
}

// breakRow runs a break statement and tells this store's own holders.
func (s *Store) breakRow(ctx context.Context, name, sql string, args ...any) (int64, error) {
	if err := s.checkArgs(ctx, name); err != nil {
		return 0, err
	}
	var token int64
	args = append([]any{name, s.q.channel, interestKey(s.q.channel, name)}, args...)
	err := retrySerialization(ctx, func() error {
		return s.pool.QueryRow(ctx, sql, args...).Scan(&token, nil, nil)
	})
	if err != nil {
		return 0, err
	}
	s.lostUpTo(name, token-1) // this store's own holders, at once
	s.seen.observe(name, token)
	return token, nil
}

func (s *Store) checkArgs(ctx context.Context, name string) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if err := s.checkOpen(); err != nil {
		return err
	}
	return checkName(name)
}
