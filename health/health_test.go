package health_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks/health"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/pgtest"
)

// TestStates walks a real election through its states: not running, leader,
// follower, Run returned.
func TestStates(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	migrate(t, db)
	a := newCandidate(t, db.NewPool(t), "health", leader.Config{})
	b := newCandidate(t, db.NewPool(t), "health", leader.Config{})
	liveA, readyA := serve(t, health.Handler(a.e)), serve(t, health.Ready(a.e))
	liveB, readyB := serve(t, health.Handler(b.e)), serve(t, health.Ready(b.e))

	if code, body := get(t, liveA); code != http.StatusServiceUnavailable || !strings.Contains(body, "not running") {
		t.Errorf("before Run: %d %q, want 503 not running", code, body)
	}
	a.run()
	waitState(t, a, 30*time.Second, "a leads", func(s leader.State) bool { return s.Leading })
	b.run()
	waitState(t, b, 30*time.Second, "b runs", func(s leader.State) bool { return s.Running })
	for _, c := range []struct {
		url  string
		want int
	}{{liveA, 200}, {readyA, 200}, {liveB, 200}, {readyB, 503}} {
		if code, body := get(t, c.url); code != c.want {
			t.Errorf("GET %s = %d %q, want %d", c.url, code, body, c.want)
		}
	}
	if _, body := get(t, liveA+"?verbose"); !strings.HasPrefix(body, "ok: leading, term ") {
		t.Errorf("verbose leader body %q", body)
	}
	if _, body := get(t, readyB); !strings.Contains(body, "not the leader") {
		t.Errorf("follower readiness body %q", body)
	}
	b.stop()
	<-b.done
	if code, _ := get(t, liveB); code != http.StatusServiceUnavailable {
		t.Errorf("after Run returned: %d, want 503", code)
	}
	if err := (&health.Checker{Elector: b.e}).Check(t.Context()); !errors.Is(err, health.ErrNotRunning) {
		t.Errorf("Check after Run returned = %v, want ErrNotRunning", err)
	}
	var nilChecker *health.Checker
	if err := nilChecker.Check(t.Context()); !errors.Is(err, health.ErrNoElector) {
		t.Errorf("nil Checker: %v", err)
	}
	if err := (&health.Checker{Elector: a.e, Tolerance: -1}).Check(t.Context()); err == nil {
		t.Error("negative Tolerance accepted")
	}
}

// TestPartitionedLeader cuts the leader off from the database for real and
// checks that its liveness handler answers 503 within 1s of its trust
// deadline passing.
func TestPartitionedLeader(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	migrate(t, db)
	proxy, dsn := db.Proxy(t, pgtest.Partitionable())
	a := newCandidate(t, poolOn(t, dsn), "partition", leader.Config{TTL: 3 * time.Second})
	url := serve(t, health.Handler(a.e))
	a.run()
	waitState(t, a, 30*time.Second, "a leads", func(s leader.State) bool { return s.Leading })
	if code, _ := get(t, url); code != 200 {
		t.Fatalf("healthy leader: %d", code)
	}
	if err := proxy.Partition(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Pass)
	var trusted time.Time // the last trust deadline seen while leading
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond) // how often a prober would look, and more
	defer tick.Stop()
	for {
		if st := a.e.State(); st.Leading {
			trusted = st.TrustedUntil
		}
		code, body := get(t, url)
		if code == http.StatusServiceUnavailable {
			late := time.Since(trusted)
			t.Logf("503 %v after the trust deadline: %s", late.Round(time.Millisecond), strings.TrimSpace(body))
			if late > time.Second {
				t.Errorf("503 came %v after the trust deadline, want ≤ 1s", late)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no 503 within 30s of the partition")
		}
		<-tick.C
	}
}
