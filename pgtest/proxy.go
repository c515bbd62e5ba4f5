package pgtest

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy in front of a server, for network faults: it passes
// traffic, delays it, blackholes it, loses it in one direction, or resets
// connections, on command, for every connection through it at once. It is
// safe for concurrent use.
//
// The proxy's faults act on bytes, above TCP: the proxy's own kernel still
// acknowledges every packet from both sides, so neither side's TCP —
// keepalives, tcp_user_timeout — ever sees its peer vanish. Only the
// client's own deadlines, and the server's own statement or idle timeouts,
// notice them. For a fault the server's TCP notices too, make the proxy
// [Partitionable] and call [Proxy.Partition].
//
//   - [Proxy.Blackhole] holds the connections open and forwards nothing, in
//     either direction, until [Proxy.Pass]; then what was held is delivered,
//     as TCP delivers after a partition heals. Clients see a query hang
//     until their own deadline; the server sees an idle session.
//   - [Proxy.DropReplies] forwards what clients send and discards what the
//     server sends back: the lost reply. A statement sent during it runs
//     and commits on the server, and the client never hears; it sees the
//     query hang until its own deadline.
//   - [Proxy.DropRequests] discards what clients send and forwards what the
//     server sends: a statement sent during it never reaches the server,
//     and the client's query hangs until its deadline.
//
// Discarded bytes are gone: after [Proxy.Pass] a connection that lost some
// is out of step with the protocol (its next reply may start mid-message),
// and a client should treat it as broken — pgx closes a connection whose
// query was cancelled or timed out, which is what tests want.
type Proxy struct {
	ln     net.Listener
	target string
	link   *netLink   // nil unless Partitionable
	linkMu sync.Mutex // serializes changes to link's drops

	mu      sync.Mutex
	mode    mode
	latency time.Duration
	changed chan struct{} // closed and replaced on every state change
	links   map[*link]struct{}
	closed  bool

	wg sync.WaitGroup
}

// mode is what the proxy does with the bytes it reads, besides latency.
type mode uint8

const (
	modePass         mode = iota // forward both ways
	modeHole                     // hold both ways
	modeDropReplies              // forward to the server, discard to the client
	modeDropRequests             // discard to the server, forward to the client
)

// direction is which way a pump copies.
type direction uint8

const (
	toServer direction = iota
	toClient
)

// verdict is what becomes of a chunk: written, discarded, or neither
// because the link closed.
type verdict uint8

const (
	deliver verdict = iota
	discard
	linkClosed
)

// link is one proxied connection: client side and server side.
type link struct {
	client, server net.Conn
	done           chan struct{}
	once           sync.Once
}

// ProxyOption configures [StartProxy].
type ProxyOption func(*proxyConfig)

type proxyConfig struct{ partitionable bool }

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

// Addr returns the proxy's listening address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Pass forwards traffic again, both ways, with no added latency,
// delivering whatever a blackhole held, and heals a partition (see
// [Proxy.Heal], whose error it drops).
func (p *Proxy) Pass() {
	p.set(modePass, 0)
	_ = p.Heal()
}

// Blackhole stops forwarding in both directions while keeping every
// connection open, new ones included; [Proxy.Pass] delivers what it held.
func (p *Proxy) Blackhole() { p.set(modeHole, p.currentLatency()) }

// DropReplies forwards everything clients send to the server and discards
// — does not hold — everything the server sends back, on every connection,
// new ones included, until [Proxy.Pass] or another mode: statements run,
// their clients never hear (the "lost reply"). What a blackhole held is
// sent on to the server and discarded on the way back. A new connection's
// startup reaches the server but its client never completes the handshake.
func (p *Proxy) DropReplies() { p.set(modeDropReplies, p.currentLatency()) }

// DropRequests discards everything clients send and forwards everything the
// server sends, until [Proxy.Pass] or another mode: statements sent during
// it never reach the server. What a blackhole held is discarded on the way
// to the server and delivered on the way back.
func (p *Proxy) DropRequests() { p.set(modeDropRequests, p.currentLatency()) }

// SetLatency delays every chunk of data, in each direction, by d. It keeps
// the current mode.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	m := p.mode
	p.mu.Unlock()
	p.set(m, d)
}

func (p *Proxy) set(m mode, latency time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode, p.latency = m, latency
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Proxy) currentLatency() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latency
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
		p.linkMu.Lock()
		p.link.close()
		p.linkMu.Unlock()
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
		go p.pump(l, c, s, toServer)
		go p.pump(l, s, c, toClient)
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

// pump copies src to dst, in direction dir, through a queue, so that added
// latency delays data without limiting throughput, a blackhole holds it and
// a one-way drop discards it.
func (p *Proxy) pump(l *link, src, dst net.Conn, dir direction) {
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
		switch p.deliverable(l, c.at, dir) {
		case linkClosed:
			return
		case discard:
			continue
		}
		if _, err := dst.Write(c.data); err != nil {
			return
		}
	}
}

// deliverable waits until data read at `at`, going in direction dir, may
// be written: the latency has passed and no blackhole is on. It says
// discard at once when the mode drops that direction, and linkClosed if the
// link closed first.
func (p *Proxy) deliverable(l *link, at time.Time, dir direction) verdict {
	for {
		p.mu.Lock()
		m, latency, changed := p.mode, p.latency, p.changed
		p.mu.Unlock()
		if (m == modeDropReplies && dir == toClient) || (m == modeDropRequests && dir == toServer) {
			return discard
		}
		hole := m == modeHole
		wait := time.Until(at.Add(latency))
		if !hole && wait <= 0 {
			return deliver
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
			return linkClosed
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
