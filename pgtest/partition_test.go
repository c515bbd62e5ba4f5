package pgtest_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

// Server-side keepalive settings for partition tests: the server gives up
// on a silent peer after idle + interval × count = 3 s, or 2 s after data
// it sent went unacknowledged.
const (
	keepIdle, keepInterval, keepCount = time.Second, time.Second, 2
	userTimeout                       = 2 * time.Second
	keepaliveBound                    = keepIdle + keepCount*keepInterval
	// observeSlack covers what lies between the server's TCP giving up and
	// the test seeing it: the backend waking and exiting, and the observer's
	// poll, on a loaded machine.
	observeSlack = 2 * time.Second
)

// TestPartition proves each packet-level fault from the server's side: the
// backend of the partitioned client ends within the keepalive bound, leaves
// pg_stat_activity and frees its session lock, while the client hears no
// reply.
func TestPartition(t *testing.T) {
	t.Parallel()
	faults := []fault{
		{"BothWays", (*pgtest.Proxy).Partition, false, false},
		{"ToServer", (*pgtest.Proxy).PartitionToServer, false, true},
		{"ToClient", (*pgtest.Proxy).PartitionToClient, true, false},
	}
	for _, f := range faults {
		// An idle session: only the server's keepalives can notice.
		t.Run(f.name+"Idle", func(t *testing.T) {
			t.Parallel()
			serverDropsSession(t, f, "")
		})
	}
	// A statement in flight: it reaches the server unless the fault drops
	// it; a reply the server cannot deliver ends the session by
	// tcp_user_timeout.
	for _, f := range faults {
		t.Run(f.name+"InFlight", func(t *testing.T) {
			t.Parallel()
			serverDropsSession(t, f, "insert into sent values (1)")
		})
	}
	t.Run("HealedSessionCarriesOn", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		p, dsn := db.Proxy(t, pgtest.Partitionable())
		conn := connect(t, dsn)
		if err := p.Partition(); err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		if _, err := conn.Exec(short, "select 1"); err == nil {
			t.Fatal("a query crossed the partition")
		}
		if err := p.Heal(); err != nil {
			t.Fatal(err)
		}
		// The cancelled query broke that pgx connection; a new one works.
		if got := currentDatabase(t, connect(t, dsn)); got != db.Name {
			t.Fatalf("after healing: %q", got)
		}
	})
	t.Run("NeedsPartitionable", func(t *testing.T) {
		t.Parallel()
		p, _ := pgtest.New(t).Proxy(t)
		for _, f := range faults {
			if err := f.cut(p); !errors.Is(err, pgtest.ErrUnsupported) {
				t.Fatalf("%s on a plain proxy: %v", f.name, err)
			}
		}
		if err := p.Heal(); err != nil {
			t.Fatalf("Heal on a plain proxy: %v", err)
		}
	})
}

// fault is a packet-level fault and which way it lets packets through.
type fault struct {
	name                      string
	cut                       func(*pgtest.Proxy) error
	requestsPass, repliesPass bool
}

// serverDropsSession holds an advisory lock through a partitionable proxy,
// waits until the server's socket has nothing in flight (so that only
// keepalives or the statement sent can reveal the fault), applies f, sends
// stmt unless it is empty, and waits for the server to end the session by
// itself. It checks that stmt ran on the server exactly when f lets
// requests through, and that the client never heard a reply.
func serverDropsSession(t *testing.T, f fault, stmt string) {
	db := pgtest.New(t)
	p, dsn := db.Proxy(t, pgtest.Partitionable())
	ctx := ctxT(t, 2*time.Minute)
	observer := db.Conn(t)
	if _, err := observer.Exec(ctx, "create table sent (x int)"); err != nil {
		t.Fatal(err)
	}
	holder := keepaliveConn(t, ctx, dsn)
	pid := int32(holder.PgConn().PID())
	if _, err := holder.Exec(ctx, "select pg_advisory_lock(42)"); err != nil {
		t.Fatal(err)
	}
	waitQuiet(t, ctx, pid)
	if err := f.cut(p); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// The client's statement is never cancelled before the server has
	// acted: a timeout would make pgx close the connection, and a FIN that
	// crosses a one-way fault would end the session before TCP's timers.
	queryCtx, cancelQuery := context.WithCancel(ctx)
	defer cancelQuery()
	reply := make(chan error, 1)
	go func() {
		var err error
		if stmt != "" {
			_, err = holder.Exec(queryCtx, stmt)
		} else {
			<-queryCtx.Done()
			err = queryCtx.Err()
		}
		reply <- err
	}()
	var gone bool
	waitFor(t, ctx, func() bool {
		gone = false
		err := observer.QueryRow(ctx, `select not exists(select 1 from pg_stat_activity where pid = $1)
			and pg_try_advisory_lock(42)`, pid).Scan(&gone)
		return err == nil && gone
	}, func() string { return fmt.Sprintf("backend %d still there after %v", pid, time.Since(start)) })
	freed := time.Since(start)
	t.Logf("server-free: backend ended and lock freed %v after the fault (keepalive bound %v)",
		freed.Round(time.Millisecond), keepaliveBound)
	select {
	case err := <-reply:
		// Giving up, the server's kernel sends a reset; across
		// PartitionToServer it reaches the proxy, which closes the client's
		// connection. Nothing else may come back, and never a success.
		if err == nil || !f.repliesPass {
			t.Fatalf("the client heard back across the fault: %v", err)
		}
		t.Logf("the client's connection closed after the server gave up: %v", err)
		reply <- err
	default:
	}
	cancelQuery()
	<-reply
	if freed > keepaliveBound+observeSlack {
		t.Fatalf("the server took %v to drop the session, over the keepalive bound %v (+%v to observe)",
			freed, keepaliveBound, observeSlack)
	}
	checkRan(t, ctx, observer, stmt, f.requestsPass)
	if err := p.Heal(); err != nil {
		t.Fatal(err)
	}
	if got := currentDatabase(t, connect(t, dsn)); got != db.Name {
		t.Fatalf("after healing: %q", got)
	}
}

// checkRan checks, once the backend is gone, that stmt ran on the server if
// and only if the fault let requests through.
func checkRan(t *testing.T, ctx context.Context, observer *pgx.Conn, stmt string, requestsPass bool) {
	t.Helper()
	if stmt == "" {
		return
	}
	var n int
	if err := observer.QueryRow(ctx, "select count(*) from sent").Scan(&n); err != nil {
		t.Fatal(err)
	}
	want := 0
	if requestsPass {
		want = 1 // the lost reply: the statement ran, the client never heard
	}
	if n != want {
		t.Fatalf("the statement sent across the fault left %d rows, want %d", n, want)
	}
}

// waitQuiet waits until the socket of backend pid has nothing in flight:
// its timer is the keepalive timer (no retransmission pending, every byte
// acknowledged). Read with ss in our namespace, where the server lives.
func waitQuiet(t *testing.T, ctx context.Context, pid int32) {
	t.Helper()
	var last string
	waitFor(t, ctx, func() bool {
		out, err := exec.CommandContext(ctx, "ss", "-tinopH", "state", "established").Output()
		if err != nil {
			last = err.Error()
			return false
		}
		last = socketOf(string(out), pid)
		return strings.Contains(last, "timer:(keepalive") && !strings.Contains(last, "unacked:")
	}, func() string { return fmt.Sprintf("backend %d's socket never went quiet: %q", pid, last) })
}

// socketOf returns the ss entry (main line and its detail line) of the
// socket owned by pid.
func socketOf(ss string, pid int32) string {
	lines := strings.Split(ss, "\n")
	key := fmt.Sprintf("pid=%d,", pid)
	for i, l := range lines {
		if strings.Contains(l, key) {
			if i+1 < len(lines) {
				l += " " + lines[i+1]
			}
			return l
		}
	}
	return ""
}

// keepaliveConn connects with server-side keepalives of keepaliveBound.
func keepaliveConn(t *testing.T, ctx context.Context, dsn string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["tcp_keepalives_idle"] = fmt.Sprint(keepIdle.Seconds())
	cfg.RuntimeParams["tcp_keepalives_interval"] = fmt.Sprint(keepInterval.Seconds())
	cfg.RuntimeParams["tcp_keepalives_count"] = fmt.Sprint(keepCount)
	cfg.RuntimeParams["tcp_user_timeout"] = fmt.Sprint(userTimeout.Milliseconds())
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}
