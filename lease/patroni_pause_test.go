package lease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// leasePause pauses the primary's PostgreSQL under the workload of
// leaseFault, continues it once another node accepts writes, and watches
// for a minute whether the resumed primary becomes writable again: with
// Debian's Patroni 3.0.2 its Patroni, whose loop was stuck on the paused
// server past the leader key's TTL, writes the leader key back
// unconditionally (fixed upstream since), the promoted node demotes itself
// and what it acknowledged meanwhile is lost. Then it reads each name's
// counter on the last primary: every acknowledged token above it will be
// handed out again. Such a loss fails t (when strict) only if the old
// primary did not take the key back: the rest is Patroni's split brain,
// logged and counted. The cluster is not reused.
func leasePause(t *testing.T, p *pgtest.Patroni, f pgtest.PatroniFault, i int, strict bool) leaseRun {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pool := pgtest.NewPool(t, patroniDSN(p))
	store := func() *lease.Store {
		s, err := lease.New(pool, lease.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { // the cluster may be gone: errors are expected
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = s.Close(ctx)
		})
		return s
	}
	held := fmt.Sprint("held-", f, "-", i)
	holder, err := store().Acquire(ctx, held, 5*time.Second, lease.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan acquired, 1)
	go func() {
		l, err := store().Acquire(ctx, held, 5*time.Second)
		got <- acquired{l, err, time.Now()}
	}()
	w := tokenLog{name: fmt.Sprint("churn-", f, "-", i)}
	stop := w.churnWith(ctx, store, 3)
	defer stop()
	w.waitAcks(t, ctx, 20)
	if !p.Supports(f) {
		t.Skipf("%s: not playable here (the nodes run on loopback)", f)
	}
	fo, err := p.Fault(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	last := fo.New
	if again := leaderOtherThan(ctx, p, fo.New, time.Minute); again != "" {
		last = again
		t.Logf("%s %d: Patroni names %s primary again %v after the fault: the resumed primary took the leader key back from %s",
			f, i, again, ms(time.Since(fo.At)), fo.New)
	}
	stop()
	acked := map[string]int64{held: holder.Token(), w.name: w.highest()}
	select {
	case a := <-got:
		if a.err == nil {
			acked[held] = max(acked[held], a.l.Token())
		}
	default:
	}
	lost := countersBelow(t, ctx, p, last, acked)
	t.Logf("%s %d: %s → %s writable after %v, last primary %s; acknowledged %v; tokens to be handed out again: %d",
		f, i, fo.Old, fo.New, ms(fo.Writable), last, acked, lost)
	if lost > 0 && strict && last == fo.New {
		t.Errorf("%s %d: %d tokens lost although the promoted node stayed primary", f, i, lost)
	}
	return leaseRun{writable: fo.Writable, reissued: lost, noHolder: true}
}

// countersBelow reads each name's counter on node and returns how many
// acknowledged tokens lie above it.
func countersBelow(t *testing.T, ctx context.Context, p *pgtest.Patroni, node string, acked map[string]int64) int {
	t.Helper()
	dsn, err := p.NodeDSN(node)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	n := 0
	for name, high := range acked {
		var token int64
		if err := conn.QueryRow(ctx, "select token from pglocks_leases where name = $1", name).Scan(&token); err != nil {
			t.Fatalf("read %s on %s: %v", name, node, err)
		}
		if token < high {
			n += int(high - token)
			t.Logf("%s on %s: counter %d, acknowledged %d: tokens %d–%d will be handed out again", name, node, token, high, token+1, high)
		}
	}
	return n
}

// leaderOtherThan polls Patroni's REST API for up to d and returns the
// first node other than not that it names primary, or "".
func leaderOtherThan(ctx context.Context, p *pgtest.Patroni, not string, d time.Duration) string {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		if name := p.Primary(ctx); name != "" && name != not {
			return name
		}
		select {
		case <-ctx.Done():
			return ""
		case <-time.After(50 * time.Millisecond):
		}
	}
}
