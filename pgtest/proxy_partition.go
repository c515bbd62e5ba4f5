package pgtest

import "fmt"

// Partitionable makes [Proxy.Partition] and its one-way variants possible:
// the proxy's connections to the server leave from a private network
// namespace through a veth pair, and a partition drops their packets with
// firewall rules (nftables, else iptables) inside that namespace. It needs
// root (or CAP_NET_ADMIN), the ip command, nft or iptables-restore, and a
// server that listens beyond loopback — pgtest's local-mode servers do, for
// the 10.251.0.0/16 range it uses. Otherwise StartProxy fails with an error
// wrapping [ErrUnsupported].
//
// The drops happen beyond the server's network interface, never in the
// server's own kernel path: to the server's TCP a partitioned peer is one
// that stopped answering, so its keepalives (tcp_keepalives_idle,
// _interval, _count) and tcp_user_timeout give up on it and the backend
// ends, freeing what its session held. (A packet the server's own kernel
// dropped would count as local congestion, retried forever.)
func Partitionable() ProxyOption { return func(c *proxyConfig) { c.partitionable = true } }

// Partition cuts the network between the proxy and the server, both ways,
// for real: every packet is dropped silently, no reset, no ICMP, until
// [Proxy.Heal] or [Proxy.Pass]. The proxy must be [Partitionable].
//
// What the client sees: its connection to the proxy stays open; queries
// hang until its own deadline, and new connections hang in the handshake.
// What the server sees: an idle session's peer stops answering keepalive
// probes, a busy one stops acknowledging data; after the keepalive bound
// (tcp_keepalives_idle + _interval × _count), or tcp_user_timeout when it is
// shorter and data is unacknowledged, the server drops the session: the
// backend leaves pg_stat_activity and its session locks are free. Without
// keepalive settings that takes the server's defaults (hours). After a
// heal, a connection the server dropped meets a reset and closes.
func (p *Proxy) Partition() error { return p.cut("Partition", true, true) }

// PartitionToServer drops every packet from the proxy to the server, and
// only those, until [Proxy.Heal] or [Proxy.Pass]: the client's requests,
// and its TCP acknowledgements, never arrive. The proxy must be
// [Partitionable].
//
// What the client sees: queries hang until its own deadline — or until the
// server gives up: the reset the server's kernel then sends does cross, and
// the proxy closes the client's connection. What the server sees: as for
// [Proxy.Partition] — its keepalive probes go unacknowledged, and it drops
// the session within the keepalive bound.
func (p *Proxy) PartitionToServer() error { return p.cut("PartitionToServer", true, false) }

// PartitionToClient drops every packet from the server to the proxy, and
// only those, until [Proxy.Heal] or [Proxy.Pass]: the lost reply at the
// packet level. The proxy must be [Partitionable].
//
// What the client sees: a statement it sends reaches the server and runs,
// but the reply never comes; the query hangs until its own deadline. What
// the server sees: requests arrive, but nothing it sends is acknowledged —
// with a reply outstanding, tcp_user_timeout (or the retransmission limit)
// ends the session; idle, its keepalive probes go unanswered and it ends
// within the keepalive bound.
func (p *Proxy) PartitionToClient() error { return p.cut("PartitionToClient", false, true) }

// Heal ends a partition of either kind: packets flow again, and TCP
// retransmits what was lost on connections both sides still hold. It leaves
// the proxy's own mode ([Proxy.Blackhole], latency, …) as it is; use
// [Proxy.Pass] to reset everything. Healing a proxy that is not partitioned,
// or not [Partitionable], does nothing.
func (p *Proxy) Heal() error {
	if p.link == nil {
		return nil
	}
	p.linkMu.Lock()
	defer p.linkMu.Unlock()
	if err := p.link.drop(false, false); err != nil {
		return fmt.Errorf("pgtest: Heal: %w", err)
	}
	return nil
}

func (p *Proxy) cut(op string, toServer, toClient bool) error {
	if p.link == nil {
		return fmt.Errorf("pgtest: %s on a proxy made without Partitionable: %w", op, ErrUnsupported)
	}
	p.linkMu.Lock()
	defer p.linkMu.Unlock()
	if err := p.link.drop(toServer, toClient); err != nil {
		return fmt.Errorf("pgtest: %s: %w", op, err)
	}
	return nil
}
