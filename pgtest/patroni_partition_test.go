package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/internal/routetest"
)

// TestPatroniPartition proves FaultPartition by what the other side of
// the cut observes, while the primary is cut off:
//
//   - a client's session on the old primary, busy with a statement every
//     100 ms, fails with ETIMEDOUT — its tcp_user_timeout gave up on a
//     silent peer: no reset, no message from the server crossed the cut
//     (the demotion's "terminating connection" never arrives);
//   - a new connection to the old primary's address times out (not
//     refused);
//   - etcd's leader key keeps naming the old primary until it expires,
//     no sooner than its lease, read just before the cut, could (an
//     expiry, not a release), and names another node before that node
//     accepts writes;
//   - the old primary, asked through its Unix socket (which the cut
//     spares), stops being a primary — its Patroni says it demoted it
//     because etcd is unreachable — before the new one accepts writes;
//   - the multi-host DSN and HAProxy reach the new primary.
//
// Then the heal: the old primary rejoins as a replica of the new one
// (through pg_rewind if Patroni needs it), and Patroni names a
// synchronous standby again. Opt-in: PGLOCKS_PATRONI=1.
func TestPatroniPartition(t *testing.T) {
	if os.Getenv("PGLOCKS_PATRONI") != "1" {
		t.Skip("Patroni tests are opt-in: set PGLOCKS_PATRONI=1")
	}
	p := NewPatroni(t, PatroniOptions{})
	if p.net == nil {
		t.Skipf("the Patroni nodes are on loopback here (%v): nothing to cut", p.netErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	old := p.Primary(ctx)
	client, sock := silentPeerConn(t, ctx, p, old)
	clientErr := queryUntilError(ctx, client)
	keyMoved := watchLeaderKey(ctx, p, old)
	// The lease expires TTL after Patroni last refreshed it, not after the
	// cut: the cluster is ready when Patroni writes the sync key, at the
	// end of an HA cycle that refreshed the lease and then slept 2 s
	// (ha.py, process_sync_replication), so the cut may come more than
	// 2 s after the last refresh.
	leaseRead := time.Now()
	leaseLeft, err := leaderLeaseLeft(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	fo, err := p.Fault(ctx, FaultPartition)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s cut off: %s accepts writes after %v; %s no primary (through its socket) after %v",
		fo.Old, fo.New, fo.Writable.Round(time.Millisecond), fo.Old, fo.ReadOnly.Round(time.Millisecond))
	checkClientCut(t, ctx, clientErr, sock, fo)
	checkLeaderKey(t, ctx, keyMoved, fo, leaseRead.Add(leaseLeft))
	if fo.ReadOnly >= fo.Writable {
		t.Errorf("the old primary was still one %v after the cut, when the new one accepted writes (%v)", fo.ReadOnly, fo.Writable)
	}
	if primary, known := p.primaryLocally(ctx, old); !known || primary {
		t.Errorf("the old primary, through its socket, while cut off: primary %v (known %v)", primary, known)
	}
	if !strings.Contains(readFile(filepath.Join(p.dir, "patroni-"+old+".log")), "because DCS is not accessible") {
		t.Errorf("the old primary's Patroni does not say it demoted it for want of etcd:\n%s", tail(filepath.Join(p.dir, "patroni-"+old+".log")))
	}
	n, err := p.node(old)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := net.DialTimeout("tcp", n.addr(n.pgPort), 2*time.Second); err == nil {
		_ = c.Close()
		t.Error("a new connection to the cut-off primary was accepted")
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Errorf("a new connection to the cut-off primary: %v, want a timeout (no reset, no ICMP)", err)
	}
	for _, dsn := range []string{p.DSN(), p.HAProxyDSN()} {
		if got := reachedPrimary(ctx, dsn); got != nil {
			t.Errorf("%s: %v", dsn, got)
		}
	}
	healed := time.Now()
	if err := fo.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if primary, known := p.primaryLocally(ctx, old); !known || primary {
		t.Errorf("the old primary after the heal: primary %v (known %v), want a replica", primary, known)
	}
	rewound := strings.Contains(readFile(filepath.Join(p.dir, "patroni-"+old+".log")), "pg_rewind")
	t.Logf("healed: %s a replica of %s with a synchronous standby %v after the heal (pg_rewind in its log: %v)",
		old, p.Primary(ctx), time.Since(healed).Round(time.Millisecond), rewound)
}

// silentPeerConn connects to node alone with tcp_user_timeout 3 s and
// keepalives every second (3 probes): a peer that goes silent is given
// up on in seconds, with ETIMEDOUT. The socket's first error is kept in
// sock: pgx (v5.12) may report another — its background reader takes
// ETIMEDOUT for a deadline's timeout and drops it, and the next read of
// the dead socket returns "unexpected EOF".
func silentPeerConn(t *testing.T, ctx context.Context, p *Patroni, node string) (*pgx.Conn, *firstErrConn) {
	t.Helper()
	dsn, err := p.NodeDSN(node)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	d := routetest.Impatient(3 * time.Second)
	var sock *firstErrConn
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil || sock != nil {
			return c, err // a cancel request's connection
		}
		sock = &firstErrConn{Conn: c}
		return sock, nil
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn, sock
}

// firstErrConn keeps the first error its connection's reads and writes
// returned, but a deadline's.
type firstErrConn struct {
	net.Conn
	mu    sync.Mutex
	first error
}

func (c *firstErrConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.note(err)
	return n, err
}

func (c *firstErrConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.note(err)
	return n, err
}

func (c *firstErrConn) note(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.first == nil && err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		c.first = err
	}
}

func (c *firstErrConn) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.first
}

// connErr is when and how a connection failed.
type connErr struct {
	err error
	at  time.Time
}

// queryUntilError runs select 1 on conn every 100 ms until one fails, and
// sends that failure.
func queryUntilError(ctx context.Context, conn *pgx.Conn) <-chan connErr {
	out := make(chan connErr, 1)
	go func() {
		for {
			if _, err := conn.Exec(ctx, "select 1"); err != nil {
				out <- connErr{err, time.Now()}
				return
			}
			select {
			case <-ctx.Done():
				out <- connErr{ctx.Err(), time.Now()}
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return out
}

func checkClientCut(t *testing.T, ctx context.Context, got <-chan connErr, sock *firstErrConn, fo *Failover) {
	t.Helper()
	select {
	case ce := <-got:
		if !errors.Is(sock.err(), syscall.ETIMEDOUT) || ce.at.Before(fo.At) {
			t.Errorf("the client's session on the cut-off primary ended %v after the cut with %v (the socket's error: %v); want ETIMEDOUT after it",
				ce.at.Sub(fo.At), ce.err, sock.err())
		} else {
			t.Logf("the client's session on the cut-off primary ended %v after the cut: the socket's error %v (pgx's: %v)",
				ce.at.Sub(fo.At).Round(time.Millisecond), sock.err(), ce.err)
		}
	case <-ctx.Done():
		t.Error("the client's session on the cut-off primary never failed")
	}
}

// watchLeaderKey polls etcd's leader key and sends when it first named
// no node or another node than old, and what it named then.
func watchLeaderKey(ctx context.Context, p *Patroni, old string) <-chan keyChange {
	out := make(chan keyChange, 1)
	go func() {
		for {
			if k, err := p.leaderKey(ctx); err == nil && k != old {
				out <- keyChange{k, time.Now()}
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return out
}

type keyChange struct {
	now string
	at  time.Time
}

// leaderLeaseLeft returns how long the leader key's lease has left to
// live, as etcd says (whole seconds, rounded down): the key cannot
// expire sooner.
func leaderLeaseLeft(ctx context.Context, p *Patroni) (time.Duration, error) {
	kv, err := p.etcdGet(ctx, "leader")
	if err != nil {
		return 0, err
	}
	if kv == nil || kv.Lease == 0 {
		return 0, fmt.Errorf("pgtest: the leader key has no lease: %+v", kv)
	}
	var l struct {
		TTL int64 `json:"TTL,string"`
	}
	if err := p.etcdPost(ctx, "/v3/lease/timetolive", fmt.Sprintf(`{"ID": %d}`, kv.Lease), &l); err != nil {
		return 0, err
	}
	if l.TTL <= 0 {
		return 0, fmt.Errorf("pgtest: the leader key's lease %d has %d s left", kv.Lease, l.TTL)
	}
	return time.Duration(l.TTL) * time.Second, nil
}

func checkLeaderKey(t *testing.T, ctx context.Context, moved <-chan keyChange, fo *Failover, expiry time.Time) {
	t.Helper()
	select {
	case k := <-moved:
		after := k.at.Sub(fo.At)
		t.Logf("etcd's leader key left %s %v after the cut (then: %q); its lease could expire %v after it",
			fo.Old, after.Round(time.Millisecond), k.now, expiry.Sub(fo.At).Round(time.Millisecond))
		if k.at.Before(expiry) {
			t.Errorf("the leader key left %s %v after the cut, %v before its lease could expire (%v after the cut): a release, not an expiry",
				fo.Old, after, expiry.Sub(k.at), expiry.Sub(fo.At))
		}
		if after > fo.Writable {
			t.Errorf("%s accepted writes %v after the cut, before the leader key left %s (%v)", fo.New, fo.Writable, fo.Old, after)
		}
	case <-ctx.Done():
		t.Error("etcd's leader key never left the cut-off primary")
	}
}

// reachedPrimary connects through dsn until it reaches a primary, for a
// minute at most.
func reachedPrimary(ctx context.Context, dsn string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			var standby bool
			err = conn.QueryRow(ctx, "select pg_is_in_recovery()").Scan(&standby)
			_ = conn.Close(ctx)
			if err == nil && !standby {
				return nil
			}
		}
		last = err
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	return errors.Join(errors.New("reached no primary within a minute"), last)
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
