package pgtest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

// TestOneWay proves each one-way proxy fault from the server's side: what
// the server did with a statement sent during it, while its client heard
// nothing.
func TestOneWay(t *testing.T) {
	t.Parallel()
	t.Run("DropRepliesRunsTheStatement", func(t *testing.T) {
		t.Parallel()
		o := newOneWay(t)
		db, p, dsn, observer, ctx, client, pid := o.db, o.p, o.dsn, o.observer, o.ctx, o.client, o.pid
		p.DropReplies()
		done := sendInsert(ctx, client)
		// The server ran the statement to the end: the row is committed and
		// the backend went idle, the insert its last query...
		waitFor(t, ctx, func() bool {
			var n int
			var idle bool
			err := observer.QueryRow(ctx, `select (select count(*) from lost),
				exists(select 1 from pg_stat_activity where pid = $1 and state = 'idle'
					and query like 'insert into lost%')`, int32(pid)).Scan(&n, &idle)
			return err == nil && n == 1 && idle
		}, func() string { return "the server never ran the statement sent during DropReplies" })
		// ...and the client has not heard.
		select {
		case err := <-done.result:
			t.Fatalf("the client heard back during DropReplies: %v", err)
		default:
		}
		done.cancel()
		if err := <-done.result; !errors.Is(err, context.Canceled) {
			t.Fatalf("client's insert: %v, want its own ctx's cancellation", err)
		}
		p.Pass()
		if got := currentDatabase(t, connect(t, dsn)); got != db.Name {
			t.Fatalf("after Pass: %q", got)
		}
	})
	t.Run("DropRequestsNeverRunsTheStatement", func(t *testing.T) {
		t.Parallel()
		o := newOneWay(t)
		db, p, dsn, observer, ctx, client, pid := o.db, o.p, o.dsn, o.observer, o.ctx, o.client, o.pid
		p.DropRequests()
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if _, err := client.Exec(short, "insert into lost values (1)"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("insert during DropRequests: %v, want the ctx deadline", err)
		}
		// Cut the connection (pgx's own close would wait up to 15 s on a
		// cancel request the proxy drops too): once the backend is gone, the
		// statement can no longer run — and it had not.
		p.Reset()
		waitFor(t, ctx, func() bool {
			var n int
			err := observer.QueryRow(ctx, "select count(*) from pg_stat_activity where pid = $1", int32(pid)).Scan(&n)
			return err == nil && n == 0
		}, func() string { return fmt.Sprintf("backend %d outlived its closed client", pid) })
		var n int
		if err := observer.QueryRow(ctx, "select count(*) from lost").Scan(&n); err != nil || n != 0 {
			t.Fatalf("rows after an insert sent during DropRequests: %d (%v), want 0", n, err)
		}
		p.Pass()
		if got := currentDatabase(t, connect(t, dsn)); got != db.Name {
			t.Fatalf("after Pass: %q", got)
		}
	})
}

// oneWay is a one-way fault's setup: a database with a table "lost", a
// proxy, a client through it with its backend's pid, and an observer
// connected directly.
type oneWay struct {
	db       *pgtest.DB
	p        *pgtest.Proxy
	dsn      string
	observer *pgx.Conn
	ctx      context.Context
	client   *pgx.Conn
	pid      uint32
}

func newOneWay(t *testing.T) oneWay {
	t.Helper()
	o := oneWay{db: pgtest.New(t), ctx: ctxT(t, time.Minute)}
	o.p, o.dsn = o.db.Proxy(t)
	o.observer = o.db.Conn(t)
	if _, err := o.observer.Exec(o.ctx, "create table lost (x int)"); err != nil {
		t.Fatal(err)
	}
	o.client = connect(t, o.dsn)
	o.pid = backendPID(t, o.client)
	return o
}

type pending struct {
	result chan error
	cancel context.CancelFunc
}

// sendInsert runs an insert on conn in the background, under a ctx the
// caller cancels.
func sendInsert(ctx context.Context, conn *pgx.Conn) pending {
	ctx, cancel := context.WithCancel(ctx)
	p := pending{result: make(chan error, 1), cancel: cancel}
	go func() {
		_, err := conn.Exec(ctx, "insert into lost values (1)")
		p.result <- err
	}()
	return p
}
