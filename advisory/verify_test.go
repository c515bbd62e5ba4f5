package advisory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
)

// TestVerify: Verify answers from a round trip sent after it was called —
// nil while the lock is held, and the loss (announced at once) when the
// session was terminated, which the Locker with a one-minute PingInterval
// would not have noticed yet; ErrNotHeld after Unlock.
func TestVerify(t *testing.T) {
	t.Parallel()
	b := setup(t, advisory.Config{PingInterval: time.Minute, KeepalivesIdle: 2 * time.Minute, TCPUserTimeout: 3 * time.Minute})
	ctx := ctxT(t)
	lk, err := b.locker.Lock(ctx, pglocks.KeyOf("verify"))
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	if err := lk.Verify(ctx); err != nil {
		t.Fatalf("Verify of a held lock = %v", err)
	}
	if v := lk.VerifiedAt(); v.Before(before) {
		t.Errorf("VerifiedAt %v after Verify is before the call (%v)", v, before)
	}

	if err := b.db.Server.TerminateBackend(ctx, lk.PID()); err != nil {
		t.Fatal(err)
	}
	if lk.Err() != nil {
		t.Fatalf("the loss was noticed before Verify (%v): the test proves nothing", lk.Err())
	}
	err = lk.Verify(ctx)
	if !errors.Is(err, advisory.ErrLost) || !errors.Is(err, advisory.ErrNotHeld) {
		t.Fatalf("Verify after the session was terminated = %v; want ErrNotHeld and ErrLost", err)
	}
	select {
	case <-lk.Lost():
	default:
		t.Error("Verify found the session dead but Lost is not closed")
	}

	lk2, err := b.locker.Lock(ctx, pglocks.KeyOf("verify"))
	if err != nil {
		t.Fatal(err)
	}
	if err := lk2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lk2.Verify(ctx); !errors.Is(err, advisory.ErrNotHeld) || errors.Is(err, advisory.ErrLost) {
		t.Errorf("Verify after Unlock = %v; want ErrNotHeld only", err)
	}
	var nilLock *advisory.Lock
	if err := nilLock.Verify(ctx); err == nil {
		t.Error("Verify of a nil *Lock = nil")
	}
	var nilCtx context.Context
	if err := lk2.Verify(nilCtx); err == nil {
		t.Error("Verify(nil ctx) = nil")
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	lk3, err := b.locker.Lock(ctx, pglocks.KeyOf("verify"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lk3.Unlock(ctx) }()
	if err := lk3.Verify(canceled); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Verify with a cancelled ctx = %v; want nil (the round trip was quicker) or context.Canceled", err)
	}
}
