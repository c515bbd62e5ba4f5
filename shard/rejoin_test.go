package shard_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
	"github.com/pglocks/pglocks/shard"
)

// heldNotice is a slog handler that signals once when a member logs that
// its identity's member row is held and it waits for it.
type heldNotice struct {
	slog.Handler
	seen chan struct{}
}

func (h heldNotice) Enabled(context.Context, slog.Level) bool { return true }

func (h heldNotice) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "member row of this identity is held") {
		select {
		case h.seen <- struct{}{}:
		default:
		}
	}
	return h.Handler.Handle(ctx, r)
}

// TestRestartLateRenewal: a crashed process's last renewal of its member
// row can commit after the restarted member read the row (it was sent
// before the crash and ran late on the server), so the row outlives the
// expiry the restarted member waited for. The restarted member waits once
// more for that holder and joins, instead of failing with
// ErrIdentityInUse. The late renewal here is the keep-alive's renewal
// statement on the row, committed right after the restarted member's read
// (the predecessor's store closed, its row left to expire, as a crash
// leaves it).
func TestRestartLateRenewal(t *testing.T) {
	t.Parallel()
	const ttl, poll = 3 * time.Second, 50 * time.Millisecond
	g := newGroup(t, 2, ttl, poll)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The old row lives 5 s: the restarted member's read, its log line and
	// the late renewal must all come before it expires (a row of 3 s,
	// waited on until under 1 s was left, left too little on a loaded
	// machine).
	const rowTTL = 5 * time.Second
	old := newCalcStore(t, g)
	row, err := old.Acquire(ctx, g.name+"#m:a", rowTTL)
	if err != nil {
		t.Fatal(err)
	}
	_ = old.Close(ctx)
	pool := g.db.NewPool(t)
	if err := pool.Ping(ctx); err != nil { // its connection open before the race
		t.Fatal(err)
	}
	// The restarted member should read less than half the row's TTL left,
	// so that the late renewal (a full TTL) extends the row well past its
	// first wait.
	waitFor(t, 30*time.Second, "the old row past half its TTL", func() bool { return time.Until(row.ExpiresAt()) < rowTTL/2 })

	notice := heldNotice{Handler: slog.New(slog.DiscardHandler).Handler(), seen: make(chan struct{}, 1)}
	m, err := shard.New(shard.Config{Group: g.name, Shards: g.shards, Store: newCalcStore(t, g), Identity: "a",
		TTL: ttl, PollInterval: poll, Logger: slog.New(notice)})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := runMember(t, m)
	select {
	case <-notice.seen:
	case <-ctx.Done():
		t.Fatal("the restarted member never reported the held row")
	}
	// The crashed process's late renewal: the keep-alive's statement,
	// scoped to the row's owner and token, taking effect only while the
	// row is still held.
	tag, err := pool.Exec(ctx, `update pglocks_leases set renewed_at = clock_timestamp(), expires_at = clock_timestamp() + ttl
		where name = $1 and owner = $2 and token = $3 and expires_at > clock_timestamp()`, row.Name(), row.Owner(), row.Token())
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("late renewal: %v, %d rows", err, tag.RowsAffected())
	}
	waitFor(t, 30*time.Second, "the restarted a owns both shards", func() bool { return r.running(t) && len(m.Owned()) == 2 })
	t.Logf("restarted member owns its shards after %v (TTL %v, row renewed after its read)", time.Since(start), ttl)
}

// TestRestartSlowLink: a restarted member whose acquire statement, sent
// when the old row expired, is cut off by the end of its wait after it
// committed (a slow link: 300 ms each way, PollInterval 200 ms) finds the
// row held by its own attempt, being cleaned up. That row is its own: it
// waits for it and joins, instead of failing with ErrIdentityInUse.
func TestRestartSlowLink(t *testing.T) {
	t.Parallel()
	const ttl, poll, oneWay = 10 * time.Second, 200 * time.Millisecond, 300 * time.Millisecond
	g := newGroup(t, 2, ttl, poll)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	old := newCalcStore(t, g) // the crashed predecessor's member row, left to expire
	if _, err := old.Acquire(ctx, g.name+"#m:a", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	_ = old.Close(ctx)
	p, dsn := g.db.Proxy(t)
	p.SetLatency(oneWay)
	st, err := lease.New(pgtest.NewPool(t, dsn), lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	m, err := shard.New(shard.Config{Group: g.name, Shards: g.shards, Store: st, Identity: "a", TTL: ttl, PollInterval: poll})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := runMember(t, m)
	waitFor(t, time.Minute, "the restarted a owns both shards", func() bool { return r.running(t) && len(m.Owned()) == 2 })
	t.Logf("restarted member behind a slow link owns its shards after %v", time.Since(start))
}
