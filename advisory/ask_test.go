package advisory_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
)

// TestWaiterAsksSparingly: a waiting Lock asks the key's holders to notify
// its unlock (a "w" NOTIFY, which every Locker's listener receives) on its
// first failed try, not on every poll: while a plain SQL client holds the
// key for a second, the waiter polls every 2–100 ms and sends one event.
func TestWaiterAsksSparingly(t *testing.T) {
	t.Parallel()
	bb := setup(t)
	ctx := ctxT(t)
	key := pglocks.KeyOf("ask-sparingly")
	holder, listener := bb.db.Conn(t), bb.db.Conn(t)
	if _, err := holder.Exec(ctx, "select pg_advisory_lock($1)", key.Int64()); err != nil {
		t.Fatal(err)
	}
	if _, err := listener.Exec(ctx, "listen "+advisory.DefaultChannel); err != nil {
		t.Fatal(err)
	}
	var asks atomic.Int64
	lctx, stop := context.WithCancel(ctx)
	counted := make(chan struct{})
	go func() {
		defer close(counted)
		for {
			n, err := listener.WaitForNotification(lctx)
			if err != nil {
				return
			}
			if n.Payload == "end" {
				return
			}
			if strings.HasPrefix(n.Payload, "w:") {
				asks.Add(1)
			}
		}
	}()
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := bb.locker.Lock(wctx, key); err == nil {
		t.Fatal("Lock took a key held by another session")
	}
	// Events come in commit order: once "end" is read, the Locker's are.
	if _, err := holder.Exec(ctx, "select pg_notify($1, 'end')", advisory.DefaultChannel); err != nil {
		t.Fatal(err)
	}
	<-counted
	stop()
	if asks.Load() == 0 {
		t.Error("the waiting Lock never asked the holders to notify")
	}
	if n := asks.Load(); n > 2 {
		t.Errorf("a Lock waiting 1 s sent %d wait events; want 1 (2 at most)", n)
	}
}
