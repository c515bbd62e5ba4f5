package advisory_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
)

// TestBlockedCallbackKeepsLocks: a user callback that blocks —
// an Observer.End or a Logger handler that never returns while it reports
// the unlock of one lock — must not stop the pings of the session that
// holds another: else the server's idle bound for lock sessions
// (idle_session_timeout = TCPUserTimeout) ends the healthy session and
// frees its locks, another client takes them, and the holder, whose Lost
// is not closed, goes on believing it holds them. The callbacks run
// outside the Locker's locks, from a goroutine of their own.
func TestBlockedCallbackKeepsLocks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  func(block <-chan struct{}) advisory.Config
	}{
		{"ObserverEnd", func(block <-chan struct{}) advisory.Config {
			return advisory.Config{Observer: &pglocks.Observer{End: func(pglocks.EndEvent) { <-block }}}
		}},
		{"Logger", func(block <-chan struct{}) advisory.Config {
			return advisory.Config{Logger: slog.New(blockingHandler{msg: "advisory: released", block: block})}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			block := make(chan struct{})
			blockedCallbackKeepsLocks(t, tc.cfg(block), block)
		})
	}
}

func blockedCallbackKeepsLocks(t *testing.T, cfg advisory.Config, block chan struct{}) {
	b := setup(t)
	cfg.ApplicationName = b.app + "-blocked"
	cfg.MaxSessions = 1
	cfg.PingInterval = 100 * time.Millisecond
	cfg.QueryTimeout = time.Second
	cfg.KeepalivesIdle, cfg.KeepalivesInterval, cfg.KeepalivesCount = time.Second, time.Second, 2
	cfg.TCPUserTimeout = 1500 * time.Millisecond
	l := newLocker(t, b.pool, cfg)
	release := sync.OnceFunc(func() { close(block) })
	defer release() // before the Locker's Close, which waits for the callbacks
	ctx := ctxT(t)
	keyA, keyB := pglocks.KeyOf("blocked-callback-a"), pglocks.KeyOf("blocked-callback-b")
	a, err := l.TryLock(ctx, keyA)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := l.TryLock(ctx, keyB)
	if err != nil {
		t.Fatal(err)
	}
	unlocked := make(chan error, 1)
	go func() { unlocked <- lb.Unlock(ctx) }() // its callback blocks, and so may Unlock
	start := time.Now()
	const watch = 4 * time.Second // more than twice TCPUserTimeout
	var tries int
	waitFor(t, "the end of the watch", watch+10*time.Second, func() bool {
		tries++
		other, err := b.locker.TryLock(ctx, keyA)
		switch {
		case errors.Is(err, advisory.ErrLocked):
		case err != nil:
			t.Fatal(err)
		default:
			_ = other.Unlock(ctx)
			select {
			case <-a.Lost():
				t.Fatalf("the holder lost A %v after the blocked callback began: %v", time.Since(start).Round(time.Millisecond), a.Err())
			default:
				t.Fatalf("two holders: another client took A %v after the blocked callback began, and A's holder was not told (Lost open)",
					time.Since(start).Round(time.Millisecond))
			}
		}
		return time.Since(start) >= watch
	})
	select {
	case <-a.Lost():
		t.Fatalf("A was lost while a callback blocked: %v", a.Err())
	default:
	}
	// The pings went on: the session was last answered a ping ago, not
	// when the callback began.
	if age := time.Since(a.VerifiedAt()); age > time.Second {
		t.Errorf("A's session was last verified %v ago, %v into the blocked callback: its pings stopped", age.Round(time.Millisecond), watch)
	}
	if err := a.Verify(ctx); err != nil {
		t.Fatalf("A after %v of a blocked callback: %v", watch, err)
	}
	t.Logf("%d tries of A by another client in %v of a blocked callback: all busy", tries, watch)
	release()
	if err := <-unlocked; err != nil {
		t.Fatalf("Unlock of B: %v", err)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// blockingHandler is a slog.Handler whose Handle blocks on records with
// message msg until block is closed.
type blockingHandler struct {
	msg   string
	block <-chan struct{}
}

func (h blockingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h blockingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		<-h.block
	}
	return nil
}

func (h blockingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h blockingHandler) WithGroup(string) slog.Handler      { return h }
