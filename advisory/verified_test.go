package advisory_test

import (
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
)

// TestVerifiedAt pins what VerifiedAt promises: it advances while the
// session answers (the pings of a session holding locks), and it never
// counts a round trip sent after the network went silent.
func TestVerifiedAt(t *testing.T) {
	t.Parallel()
	_, p, l := proxied(t, advisory.Config{PingInterval: 50 * time.Millisecond, QueryTimeout: 500 * time.Millisecond})
	before := time.Now()
	lk, err := l.Lock(ctxT(t), pglocks.KeyOf("verified"))
	if err != nil {
		t.Fatal(err)
	}
	first := lk.VerifiedAt()
	if first.Before(before) || first.After(time.Now()) {
		t.Fatalf("VerifiedAt %v is not the send time of the acquiring try (between %v and now)", first, before)
	}
	waitFor(t, "a ping to advance VerifiedAt", 30*time.Second, func() bool { return lk.VerifiedAt().After(first) })

	cut := time.Now()
	p.Blackhole()
	select {
	case <-lk.Lost():
	case <-time.After(30 * time.Second):
		t.Fatal("the lock was not lost behind a blackhole")
	}
	if v := lk.VerifiedAt(); !v.Before(cut) {
		t.Fatalf("VerifiedAt %v counts a round trip sent after the cut at %v", v, cut)
	}
	p.Pass()
}
