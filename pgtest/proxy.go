package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Proxy is a TCP proxy in front of a server, for network faults: it passes
// traffic, delays it, blackholes it or resets connections, on command, for
// every connection through it at once. It is safe for concurrent use.
//
// A blackhole holds the connections open and forwards nothing, in either
// direction, until [Proxy.Pass]; then what was held is delivered, as TCP
// delivers after a partition heals. Clients see a query hang until their own
// deadline. The server does not notice: the proxy's kernel still
// acknowledges its packets, so server-side keepalives find the peer alive.
// For a fault the server notices too, make the proxy [Partitionable] and
// call [Proxy.Partition].
type Proxy struct {
	ln     net.Listener
	target string
	link   *netLink // nil unless Partitionable

	mu      sync.Mutex
	hole    bool
	latency time.Duration
	changed chan struct{} // closed and replaced on every state change
	links   map[*link]struct{}
	closed  bool

	wg sync.WaitGroup
}

// link is one proxied connection: client side and server side.
type link struct {
	client, server net.Conn
	done           chan struct{}
	once           sync.Once
}

// ProxyOption configures [StartProxy].
type ProxyOption func(*proxyConfig)

type proxyConfig struct{ partitionable bool }

// Partitionable makes [Proxy.Partition] possible: the proxy's connections to
// the server leave from a private network namespace through a veth pair, so
// that a partition can drop their packets in the kernel. It needs root (or
// CAP_NET_ADMIN), the ip and tc commands, and a server that listens beyond
// loopback — pgtest's local-mode servers do, for the 10.251.0.0/16 range it
// uses. Otherwise StartProxy fails with an error wrapping [ErrUnsupported].
func Partitionable() ProxyOption { return func(c *proxyConfig) { c.partitionable = true } }

// StartProxy listens on a free loopback port and forwards every connection
// to target (host:port). Close it when done.
func StartProxy(target string, opts ...ProxyOption) (*Proxy, error) {
	var cfg proxyConfig
	for _, o := range opts {
		o(&cfg)
	}
	p := &Proxy{target: target, changed: make(chan struct{}), links: map[*link]struct{}{}}
	if cfg.partitionable {
		_, port, err := net.SplitHostPort(target)
		if err != nil {
			return nil, err
		}
		if p.link, err = newNetLink(); err != nil {
			return nil, err
		}
		// From inside the namespace the server is at the root side's address.
		p.target = net.JoinHostPort(p.link.rootIP, port)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		if p.link != nil {
			p.link.close()
		}
		return nil, err
	}
	p.ln = ln
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// NewProxy is [StartProxy] for a test: it fails the test on error — skips
// it, when a [Partitionable] proxy is impossible here — and closes the proxy
// when the test ends.
func NewProxy(t testing.TB, target string, opts ...ProxyOption) *Proxy {
	t.Helper()
	p, err := StartProxy(target, opts...)
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// Partition cuts the network between the proxy and the server for real:
// every packet, both ways, is dropped by the kernel without a reset, so the
// server's keepalives and tcp_user_timeout — not only the client's deadlines
// — see the peer vanish. Clients are cut off too. [Proxy.Pass] heals it. The
// proxy must be [Partitionable].
func (p *Proxy) Partition() error {
	if p.link == nil {
		return fmt.Errorf("pgtest: Partition on a proxy made without Partitionable: %w", ErrUnsupported)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.link.cut()
}

// Addr returns the proxy's listening address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Pass forwards traffic again, with no added latency, delivering whatever a
// blackhole held, and heals a partition.
func (p *Proxy) Pass() {
	p.set(false, 0)
	if p.link != nil {
		p.mu.Lock()
		_ = p.link.heal()
		p.mu.Unlock()
	}
}

// Blackhole stops forwarding in both directions while keeping every
// connection open, new ones included.
func (p *Proxy) Blackhole() { p.set(true, p.currentLatency()) }

// SetLatency delays every chunk of data, in each direction, by d.
func (p *Proxy) SetLatency(d time.Duration) { p.set(p.isHole(), d) }

func (p *Proxy) set(hole bool, latency time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hole, p.latency = hole, latency
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Proxy) currentLatency() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latency
}

func (p *Proxy) isHole() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hole
}

// Reset resets every open connection, sending TCP RST to both the client
// and the server, and returns how many it reset. New connections pass.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.close(true)
	}
	return len(links)
}

// Close stops listening, resets every connection and waits for the proxy's
// goroutines. It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	already := p.closed
	p.closed = true
	p.mu.Unlock()
	if already {
		return nil
	}
	err := p.ln.Close()
	p.Reset()
	p.wg.Wait()
	if p.link != nil {
		p.link.close()
	}
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		s, err := p.dial()
		if err != nil {
			_ = c.Close()
			continue
		}
		l := &link{client: c, server: s, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.close(true)
			return
		}
		p.links[l] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pump(l, c, s)
		go p.pump(l, s, c)
	}
}

func (p *Proxy) dial() (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if p.link != nil {
		return p.link.dial(ctx, p.target)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", p.target)
}

// chunk is data read at a time, to be written at at + latency.
type chunk struct {
	data []byte
	at   time.Time
}

// pump copies src to dst through a queue, so that added latency delays data
// without limiting throughput, and a blackhole holds it.
func (p *Proxy) pump(l *link, src, dst net.Conn) {
	defer p.wg.Done()
	queue := make(chan chunk, 64)
	go func() {
		defer close(queue)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case queue <- chunk{buf[:n], time.Now()}:
				case <-l.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		l.close(false)
		for range queue { // let the reader finish
		}
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	for c := range queue {
		if !p.deliverable(l, c.at) {
			return
		}
		if _, err := dst.Write(c.data); err != nil {
			return
		}
	}
}

// deliverable waits until data read at `at` may be written: the latency has
// passed and no blackhole is on. False if the link closed first.
func (p *Proxy) deliverable(l *link, at time.Time) bool {
	for {
		p.mu.Lock()
		hole, latency, changed := p.hole, p.latency, p.changed
		p.mu.Unlock()
		wait := time.Until(at.Add(latency))
		if !hole && wait <= 0 {
			return true
		}
		var timer *time.Timer
		var fire <-chan time.Time
		if !hole {
			timer = time.NewTimer(wait)
			fire = timer.C
		}
		select {
		case <-changed:
		case <-fire:
		case <-l.done:
			return false
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// close ends both sides of the link; with reset, as a TCP RST.
func (l *link) close(reset bool) {
	l.once.Do(func() {
		close(l.done)
		for _, c := range []net.Conn{l.client, l.server} {
			if tc, ok := c.(*net.TCPConn); ok && reset {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
		}
	})
}

// errNoTCP is returned when a server is reached through a Unix socket,
// which a TCP proxy cannot stand in front of.
var errNoTCP = errors.New("pgtest: server is not reached over TCP; a proxy needs a host and port")

// Addr returns the server's TCP address, host:port.
func (s *Server) Addr() (string, error) {
	cfg, err := pgconn.ParseConfig(s.adminDSN)
	if err != nil {
		return "", err
	}
	if strings.HasPrefix(cfg.Host, "/") {
		return "", errNoTCP
	}
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), nil
}

// Proxy starts a [Proxy] in front of the database's server, closed when the
// test ends, and returns it with a DSN that connects to the database through
// it.
func (d *DB) Proxy(t testing.TB, opts ...ProxyOption) (p *Proxy, dsn string) {
	t.Helper()
	addr, err := d.Server.Addr()
	if err != nil {
		t.Fatal(err)
	}
	var cfg proxyConfig
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.partitionable && d.Server.Mode() != ModeLocal {
		t.Skipf("pgtest: a partitionable proxy needs a local-mode server, not %s", d.Server.Mode())
	}
	p = NewProxy(t, addr, opts...)
	dsn, err = ViaProxy(d.DSN, p)
	if err != nil {
		t.Fatal(err)
	}
	return p, dsn
}

// ViaProxy returns dsn changed to connect through p instead of directly.
func ViaProxy(dsn string, p *Proxy) (string, error) {
	host, port, err := net.SplitHostPort(p.Addr())
	if err != nil {
		return "", err
	}
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Host = p.Addr()
		q := u.Query()
		q.Del("host")
		q.Del("port")
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	return fmt.Sprintf("%s host=%s port=%s", dsn, host, port), nil
}
