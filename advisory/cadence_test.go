package advisory_test

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
)

// TestPingCadence: the server ends a lock session it has not
// heard from for TCPUserTimeout (idle_session_timeout), so the gap between
// two messages of an idle, healthy holder is all the margin a stall of the
// holder (GC, a busy machine, a slow scheduler) has before the server frees
// its locks. The pings of a session holding locks go out at least every
// min(PingInterval, TCPUserTimeout/2), so that margin is at least
// TCPUserTimeout/2 whatever PingInterval is. Measured at the wire, by a
// relay that timestamps what the holder sends.
func TestPingCadence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addr, err := b.db.Server.Addr()
	if err != nil {
		t.Fatal(err)
	}
	tp := newTap(t, addr)
	cfg := advisory.Config{
		ApplicationName: b.app + "-cadence",
		MaxSessions:     1,
		PingInterval:    5500 * time.Millisecond, // accepted: 5.5s + 0.4s < 6s
		QueryTimeout:    400 * time.Millisecond,
		TCPUserTimeout:  6 * time.Second,
	}
	l := newLocker(t, lazyPool(t, viaAddr(t, b.db.DSN, tp.addr())), cfg)
	ctx := ctxT(t)
	lk, err := l.Lock(ctx, pglocks.KeyOf("cadence"))
	if err != nil {
		t.Fatal(err)
	}
	var port int32
	if err := b.pool.QueryRow(ctx, "select client_port from pg_stat_activity where pid = $1", int32(lk.PID())).Scan(&port); err != nil {
		t.Fatal(err)
	}
	from := time.Now()
	const watch = 14 * time.Second
	select {
	case <-lk.Lost():
		t.Fatalf("lost while idle: %v", lk.Err())
	case <-time.After(watch):
	}
	sends := tp.sends(int(port), from)
	bound := cfg.TCPUserTimeout/2 + 1500*time.Millisecond // slack for a loaded 2-core machine
	var worst time.Duration
	prev := from
	for _, at := range append(sends, time.Now()) {
		worst = max(worst, at.Sub(prev))
		prev = at
	}
	t.Logf("%d messages from the idle holder in %v; longest silence %v (TCPUserTimeout %v, PingInterval %v)",
		len(sends), watch, worst.Round(time.Millisecond), cfg.TCPUserTimeout, cfg.PingInterval)
	if worst > bound {
		t.Errorf("the idle holder was silent for %v: more than TCPUserTimeout/2 (+%v slack), leaving a stall less than %v before the server ends the session",
			worst.Round(time.Millisecond), bound-cfg.TCPUserTimeout/2, (cfg.TCPUserTimeout - worst).Round(time.Millisecond))
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// viaAddr returns dsn, a URL, changed to connect to addr.
func viaAddr(t *testing.T, dsn, addr string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

// tap is a TCP relay that notes when each connection's client sends
// something, by the local port of its connection to the server.
type tap struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn
	times map[int][]time.Time // by upstream local port
}

func newTap(t *testing.T, target string) *tap {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tp := &tap{ln: ln, target: target, times: map[int][]time.Time{}}
	tp.wg.Add(1)
	go tp.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		tp.mu.Lock()
		for _, c := range tp.conns {
			_ = c.Close()
		}
		tp.mu.Unlock()
		tp.wg.Wait()
	})
	return tp
}

func (tp *tap) addr() string { return tp.ln.Addr().String() }

func (tp *tap) accept() {
	defer tp.wg.Done()
	for {
		down, err := tp.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", tp.target)
		if err != nil {
			_ = down.Close()
			continue
		}
		port := up.LocalAddr().(*net.TCPAddr).Port
		tp.mu.Lock()
		tp.conns = append(tp.conns, down, up)
		tp.mu.Unlock()
		tp.wg.Add(2)
		go func() {
			defer tp.wg.Done()
			_, _ = io.Copy(down, up)
			_ = down.Close()
		}()
		go func() {
			defer tp.wg.Done()
			defer up.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := down.Read(buf)
				if n > 0 {
					tp.mu.Lock()
					tp.times[port] = append(tp.times[port], time.Now())
					tp.mu.Unlock()
					if _, werr := up.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// sends returns when the client of the connection whose server side has
// local port port sent something, from from on.
func (tp *tap) sends(port int, from time.Time) []time.Time {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	var out []time.Time
	for _, at := range tp.times[port] {
		if !at.Before(from) {
			out = append(out, at)
		}
	}
	return out
}
