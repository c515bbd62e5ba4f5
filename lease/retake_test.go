package lease_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/lease"
)

// TestRetakeThatTakesNothingSendsNoLoss: a store that has seen the name
// retries an expired row while another transaction extends it (a renewal
// or resume whose check ran before the expiry and whose commit lands
// after). Its statement takes nothing — the newest row version is not
// expired — and must tell no holder that its lease is over: a lost notice
// ("every acquisition up to token N is over") would end a lease the
// server says is held. PostgreSQL evaluates an UPDATE's SET list on the
// snapshot's row version before it waits for the row lock, so a notice
// sent from there went out although the recheck updated nothing.
func TestRetakeThatTakesNothingSendsNoLoss(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	holder, err := b.store.TryAcquire(ctx, "retake", 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	retaker := newStore(t, b.pool, lease.Config{})
	if _, err := retaker.TryAcquire(ctx, "retake", time.Minute); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("the retaker's first try: %v, want ErrHeld (so it has seen the name)", err)
	}
	listen, extend, marker := b.db.Conn(t), b.db.Conn(t), b.db.Conn(t)
	channel := b.store.Config().Channel
	if _, err := listen.Exec(ctx, "listen "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	poll(t, 30*time.Second, "the lease to expire by the server clock", func() bool {
		var expired bool
		err := b.pool.QueryRow(ctx, "select expires_at <= clock_timestamp() from pglocks_leases where name = 'retake'").Scan(&expired)
		return err == nil && expired
	})
	tx, err := extend.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "update pglocks_leases set expires_at = clock_timestamp() + interval '1 minute' where name = 'retake'"); err != nil {
		t.Fatal(err)
	}
	tried := make(chan error, 1)
	go func() { _, err := retaker.TryAcquire(ctx, "retake", time.Minute); tried <- err }()
	poll(t, 30*time.Second, "the retake to wait for the extension's row lock", func() bool {
		var n int
		err := b.pool.QueryRow(ctx, `select count(*) from pg_stat_activity
			where datname = current_database() and wait_event_type = 'Lock' and query like '%update%'`).Scan(&n)
		return err == nil && n > 0
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-tried; !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("the retake behind the extension: %v, want ErrHeld", err)
	}
	// Everything the retake's commit sent arrives before this marker.
	if _, err := marker.Exec(ctx, "select pg_notify($1, 'marker')", channel); err != nil {
		t.Fatal(err)
	}
	for {
		n, err := listen.WaitForNotification(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n.Payload == "marker" {
			break
		}
		if strings.HasPrefix(n.Payload, "l") && strings.HasSuffix(n.Payload, ":retake") {
			t.Fatalf("a retake that took nothing sent the lost notice %q (holder token %d)", n.Payload, holder.Token())
		}
	}
}
