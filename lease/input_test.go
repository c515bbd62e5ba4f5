package lease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/lease"
)

// TestKeepAliveMarginChecked: a kept-alive lease whose trust
// window (TTL − SafetyMargin) ends before its first renewal (TTL ×
// RenewFraction) would be declared lost while healthy; such a TTL is
// refused, naming the fields, instead of acquired.
func TestKeepAliveMarginChecked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	s := newStore(t, b.pool, lease.Config{SafetyMargin: 2 * time.Second})
	_, err := s.TryAcquire(ctx, "b9", 2500*time.Millisecond, lease.WithKeepAlive())
	if !errors.Is(err, lease.ErrInvalidTTL) || !strings.Contains(err.Error(), "RenewFraction") {
		t.Fatalf("TTL 2.5s, margin 2s, keep-alive: %v, want ErrInvalidTTL naming RenewFraction", err)
	}
	// Without keep-alive nobody renews on a schedule: margin < TTL suffices.
	l := mustTry(t, s, "b9", 2500*time.Millisecond)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A pair that leaves room: renewed every second, trusted for 3 s.
	l = mustTry(t, s, "b9", 5*time.Second, lease.WithKeepAlive())
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestNilArguments: nil contexts and a nil transaction give
// errors, not panics.
func TestNilArguments(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	l := mustTry(t, b.store, "nil", time.Minute)
	var nilCtx context.Context
	for op, f := range map[string]func() error{
		"TryAcquire": func() error { _, err := b.store.TryAcquire(nilCtx, "x", time.Second); return err },
		"Acquire":    func() error { _, err := b.store.Acquire(nilCtx, "x", time.Second); return err },
		"Do": func() error {
			return b.store.Do(nilCtx, "x", time.Second, func(context.Context) error { return nil })
		},
		"Resume":     func() error { _, err := b.store.Resume(nilCtx, l.Handle()); return err },
		"Get":        func() error { _, err := b.store.Get(nilCtx, "x"); return err },
		"List":       func() error { _, err := b.store.List(nilCtx); return err },
		"IsHeld":     func() error { _, err := b.store.IsHeld(nilCtx, "x"); return err },
		"Break":      func() error { _, err := b.store.Break(nilCtx, "x"); return err },
		"Migrate":    func() error { return b.store.Migrate(nilCtx) },
		"Renew":      func() error { return l.Renew(nilCtx) },
		"Assert":     func() error { return l.Assert(nilCtx, 0) },
		"Release":    func() error { return l.Release(nilCtx) },
		"Guard(nil)": func() error { return l.Guard(nilCtx, nil) },
		"Guard(ctx)": func() error { return guardNilCtx(ctx, b, l) },
		"Guard(tx)":  func() error { return l.Guard(ctx, nil) },
		"Close(nil)": func() error { return closeNil(t, b) },
		"Do(nil fn)": func() error { return b.store.Do(ctx, "x", time.Second, nil) },
		"WithOwner()": func() error {
			_, err := b.store.TryAcquire(ctx, "x", time.Second, lease.WithOwner(uuid.Nil))
			return err
		},
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s: panic: %v", op, r)
				}
			}()
			if err := f(); err == nil {
				t.Errorf("%s: no error", op)
			}
		}()
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("the lease was disturbed: %v", err)
	}
}

func closeNil(t *testing.T, b bundle) error {
	var nilCtx context.Context
	s, err := lease.New(b.pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	return s.Close(nilCtx)
}

func guardNilCtx(ctx context.Context, b bundle, l *lease.Lease) error {
	var nilCtx context.Context
	return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return l.Guard(nilCtx, tx) })
}

// TestLongNameInErrors: errors about an over-long name quote
// a shortened name, not the whole of it.
func TestLongNameInErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	name := strings.Repeat("n", 1<<20)
	_, err := b.store.TryAcquire(ctxT(t), name, time.Second)
	if err == nil || len(err.Error()) > 400 {
		t.Fatalf("error of %d bytes for a 1 MiB name: %.200v", len(err.Error()), err)
	}
}

// TestQuickStartBusy: README's lease quick start, as
// written there, when the lease is busy: TryAcquire returns a HeldError
// and a nil *Lease, and the code goes on to `defer l.Release(ctx)` and
// l.Guard. Neither panics (both did before the fix); each returns an
// error saying there is no lease.
func TestQuickStartBusy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	mustTry(t, b.store, "job:nightly", time.Minute)
	store, pool := b.store, b.pool
	var releaseErr error
	err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		l, err := store.TryAcquire(ctx, "job:nightly", 30*time.Second, lease.WithKeepAlive())
		var held *lease.HeldError
		if errors.As(err, &held) { /* held by held.Owner for another held.ExpiresIn */
		}
		defer func() { releaseErr = l.Release(ctx) }()
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := l.Guard(ctx, tx); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "select 1")
			return err
		})
	}()
	t.Logf("Guard: %v; Release: %v", err, releaseErr)
	if err == nil || strings.Contains(err.Error(), "panic") || !strings.Contains(err.Error(), "nil *Lease") {
		t.Errorf("Guard of the nil lease = %v, want an error naming the nil *Lease", err)
	}
	if releaseErr == nil || !strings.Contains(releaseErr.Error(), "nil *Lease") {
		t.Errorf("Release of the nil lease = %v, want an error naming the nil *Lease", releaseErr)
	}
}
