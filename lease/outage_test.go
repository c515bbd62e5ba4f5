package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/pgtest"
)

// TestDoReleaseNotSent: Store.Do's release meets a
// server that is restarting — its sessions ended, new connections refused
// — so the release is never sent. Once the server is back the name is
// released, not kept alive for good (before the fix: the Lease stayed
// live and its keep-alive restarted, renewing the row until Store.Close,
// and Do's caller had no Lease to retry the release with).
func TestDoReleaseNotSent(t *testing.T) {
	t.Parallel()
	o := newOutage(t)
	s := newStore(t, o.pool, lease.Config{})
	ctx := ctxT(t)
	const ttl = 3 * time.Second
	err := s.Do(ctx, "outage", ttl, func(ctx context.Context) error {
		o.begin(t, ctx)
		return nil
	})
	t.Logf("Do with its release refused: %v", err)
	o.end(t)
	o.waitReleased(t, "outage", 3*ttl)
}

// TestReleaseNotSentEndsLease: a Release that could not be sent ends the
// Lease at once, not lost (the holder gave it up), and the release goes on
// in the background until the server answers; the keep-alive does not
// start again.
func TestReleaseNotSentEndsLease(t *testing.T) {
	t.Parallel()
	o := newOutage(t)
	s := newStore(t, o.pool, lease.Config{})
	ctx := ctxT(t)
	l := mustTry(t, s, "gone", 3*time.Second, lease.WithKeepAlive())
	o.begin(t, ctx)
	err := l.Release(ctx)
	t.Logf("Release with its dial refused: %v", err)
	if err == nil {
		t.Fatal("Release succeeded with every dial refused")
	}
	if l.Context().Err() == nil || l.Err() == nil {
		t.Fatalf("the Lease is still live after a Release that was not sent (Release: %v)", err)
	}
	select {
	case <-l.Lost():
		t.Fatalf("Lost closed by the holder's own Release: %v", l.Err())
	default:
	}
	if !errors.Is(l.Err(), lease.ErrReleased) || !errors.Is(err, lease.ErrReleased) {
		t.Fatalf("Err %v, Release %v: want both to wrap ErrReleased", l.Err(), err)
	}
	if err := l.Renew(ctx); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Renew after the release = %v, want ErrNotHeld", err)
	}
	o.end(t)
	o.waitReleased(t, "gone", 10*time.Second)
}

// outage is a pool whose server "restarts" on begin: its sessions are
// ended and its new connections refused until end.
type outage struct {
	db    *pgtest.DB
	pool  *pgxpool.Pool
	admin *pgxpool.Pool // not behind the refuser
	ref   *pgtest.Refuser
	app   string
}

func newOutage(t *testing.T) *outage {
	t.Helper()
	o := &outage{db: pgtest.New(t), ref: pgtest.NewRefuser(t), app: "pglocks-outage"}
	o.pool = o.db.NewPool(t, o.ref.Install, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["application_name"] = o.app
	})
	o.admin = o.db.NewPool(t)
	return o
}

// begin refuses new connections, makes the pool drop the ones it has and
// ends every session of the pool's application (the store's listener
// included), as a server restart does.
func (o *outage) begin(t *testing.T, ctx context.Context) {
	t.Helper()
	o.ref.Refuse()
	o.pool.Reset() // connections handed out before are closed when put back
	if _, err := o.db.TerminateApplication(ctx, o.app); err != nil {
		t.Fatal(err)
	}
}

// end lets connections through again, once two more dials were refused
// after the call: the outage outlasts whatever ran at its start.
func (o *outage) end(t *testing.T) {
	t.Helper()
	if o.ref.Refused() == 0 {
		t.Fatal("no dial was refused: the outage did not meet the release")
	}
	n := o.ref.Refused()
	eventually(t, 30*time.Second, "two more refused dials", func() bool { return o.ref.Refused() >= n+2 })
	o.ref.Allow()
}

// waitReleased waits until the row of name is not held, failing the test
// after d with the row's state.
func (o *outage) waitReleased(t *testing.T, name string, d time.Duration) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(d)
	for {
		var (
			held  bool
			token int64
			left  float64 // seconds
		)
		err := o.admin.QueryRow(context.Background(), `select owner is not null and expires_at > now(), token,
			extract(epoch from greatest(expires_at - now(), interval '0'))::float8 from pglocks_leases where name = $1`, name).Scan(&held, &token, &left)
		if err == nil && !held {
			t.Logf("the row of %s was released %v after the outage ended", name, time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v after the outage the row is still held (token %d, expires in %.1fs; err %v): the name is kept alive for good",
				d, token, left, err)
		}
		time.Sleep(50 * time.Millisecond) // polling the row, not synchronizing
	}
}
