package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/lease"
)

// TestNotHeldTable is the table of ways a lease ends: renew, release, assert and
// guard succeed for the right owner and report ErrNotHeld for a wrong
// owner, a wrong token, an expired lease, a released one and a missing row.
func TestNotHeldTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	scenarios := []struct {
		name  string
		setup string // SQL applied to the lease's row; "" leaves it held
		ok    bool
	}{
		{"CorrectOwner", "", true},
		{"WrongOwner", "update pglocks_leases set owner = gen_random_uuid() where name = $1", false},
		{"WrongToken", "update pglocks_leases set token = token + 1 where name = $1", false},
		{"Expired", "update pglocks_leases set expires_at = now() - interval '1 ms' where name = $1", false},
		{"Released", "update pglocks_leases set owner = null, expires_at = now() where name = $1", false},
		{"NotFound", "delete from pglocks_leases where name = $1", false},
	}
	ops := []struct {
		name string
		do   func(ctx context.Context, l *lease.Lease) error
	}{
		{"Renew", func(ctx context.Context, l *lease.Lease) error { return l.Renew(ctx) }},
		{"Release", func(ctx context.Context, l *lease.Lease) error { return l.Release(ctx) }},
		{"Assert", func(ctx context.Context, l *lease.Lease) error { return l.Assert(ctx, time.Second) }},
		{"Guard", func(ctx context.Context, l *lease.Lease) error {
			return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return l.Guard(ctx, tx) })
		}},
	}
	for _, sc := range scenarios {
		for _, op := range ops {
			t.Run(sc.name+"/"+op.name, func(t *testing.T) {
				t.Parallel()
				ctx := ctxT(t)
				name := sc.name + "/" + op.name
				l := mustTry(t, b.store, name, time.Minute)
				if sc.setup != "" {
					exec(t, b.pool, sc.setup, name)
				}
				err := op.do(ctx, l)
				switch {
				case sc.ok && err != nil:
					t.Fatalf("%s: %v, want success", op.name, err)
				case !sc.ok && !errors.Is(err, lease.ErrNotHeld):
					t.Fatalf("%s: %v, want ErrNotHeld", op.name, err)
				}
			})
		}
	}
}

func TestRenewExtends(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	l := mustTry(t, b.store, "renew", time.Minute)
	exp, trust := l.ExpiresAt(), l.TrustedUntil()
	exec(t, b.pool, "update pglocks_leases set expires_at = now() + interval '1 second' where name = 'renew'")
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if !l.ExpiresAt().After(exp) || !l.TrustedUntil().After(trust) {
		t.Fatalf("renew did not extend: expiry %v → %v, trust %v → %v", exp, l.ExpiresAt(), trust, l.TrustedUntil())
	}
	if err := l.Assert(ctx, 50*time.Second); err != nil {
		t.Fatalf("after renew: %v", err)
	}
}

func TestAssertTimeLeft(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	l := mustTry(t, b.store, "assert", time.Minute)
	if err := l.Assert(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.Assert(ctx, 2*time.Minute); !errors.Is(err, lease.ErrTimeLeft) {
		t.Fatalf("Assert(2m) of a 1m lease: %v, want ErrTimeLeft", err)
	}
}

func TestReleaseTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	l := mustTry(t, b.store, "twice", time.Minute)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("second release: %v, want ErrNotHeld", err)
	}
	if c := context.Cause(l.Context()); !errors.Is(c, lease.ErrReleased) {
		t.Fatalf("cause = %v, want ErrReleased", c)
	}
	select {
	case <-l.Lost():
		t.Fatal("Lost closed by a release")
	default:
	}
	if err := l.Renew(ctx); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("renew after release: %v, want ErrNotHeld", err)
	}
}

// TestRenewLosesLease: a renewal that finds the lease taken over declares
// it lost at once.
func TestRenewLosesLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	l := mustTry(t, b.store, "lost", time.Minute)
	expire(t, b.pool, "lost")
	mustTry(t, b.store, "lost", time.Minute)
	if err := l.Renew(ctx); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("renew: %v", err)
	}
	waitFor(t, l.Lost(), time.Second, "loss")
	if err := l.Err(); !errors.Is(err, lease.ErrLost) || !errors.Is(context.Cause(l.Context()), lease.ErrLost) {
		t.Fatalf("Err = %v, cause %v; want ErrLost", err, context.Cause(l.Context()))
	}
}
