package pgtest

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// patroniNet is the network a Patroni cluster's nodes live on where they
// can be cut off (Linux, root, ip and nft): a private switch — a bridge in
// a network namespace of its own — with one port per node, each node (its
// Patroni and its PostgreSQL) in a namespace of its own behind a veth
// pair, and one port to our namespace, where etcd, HAProxy and the test's
// clients are. The cluster has a /28 of 10.252.0.0/16 to itself: our end
// .1, node i .2+i.
//
// A node is cut off in the switch, which drops every frame to or from
// its port but ARP (an IP partition: neighbours stay resolved). The drops
// happen beyond every endpoint's interface, so to each side's TCP the
// other has simply stopped answering: retransmissions, keepalives and
// tcp_user_timeout give up on it as they would across a real network (a
// packet an endpoint's own kernel drops counts as local congestion and is
// retried forever; see drop.go). Nothing is filtered in our namespace or
// in a node's.
type patroniNet struct {
	id     int    // 0–4095: the /28, and every name below
	sw     string // the switch's namespace
	rootIf string // our end of the link to the switch
	nodes  int

	mu  sync.Mutex
	cut []int // nodes cut off now
}

// patroniNetSubnet is where the clusters' /28s are.
const patroniNetSubnet = "10.252.0.0/16"

// patroniNetUsable reports whether nodes can live in namespaces here.
func patroniNetUsable() bool {
	if !linksUsable() {
		return false
	}
	for _, b := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(b); err != nil {
			return false
		}
	}
	return true
}

// maxPatroniNodes is how many nodes fit a cluster's /28 beside our end
// (.1 of the /28's hosts) and its broadcast address.
const maxPatroniNodes = 13

// newPatroniNet makes the switch and our link to it. It reserves a /28 by
// creating the switch's namespace, whose name carries it (ip netns add
// fails for a name taken), and at once records the names the cluster
// will use in dir/netns for the watchdog, nodes namespaces for nodes.
func newPatroniNet(dir string, nodes int) (*patroniNet, error) {
	var lastErr error
	for range 8 {
		var b [2]byte
		_, _ = rand.Read(b[:])
		n := &patroniNet{id: int(binary.BigEndian.Uint16(b[:]) & 0xfff), nodes: nodes}
		n.sw = fmt.Sprintf("pgtest-p%03x", n.id)
		n.rootIf = fmt.Sprintf("pgp%03xr", n.id)
		if err := run("ip", "netns", "add", n.sw); err != nil {
			lastErr = err // another cluster's, or not permitted
			continue
		}
		names := []string{"link " + n.rootIf}
		for i := range nodes {
			names = append(names, "netns "+n.nodeNS(i))
		}
		names = append(names, "netns "+n.sw)
		if err := os.WriteFile(filepath.Join(dir, "netns"), []byte(strings.Join(names, "\n")+"\n"), 0o644); err != nil {
			_ = run("ip", "netns", "del", n.sw)
			return nil, err
		}
		if err := n.setup(); err != nil {
			n.close()
			_ = os.Remove(filepath.Join(dir, "netns")) // the names are free again: no watchdog of ours may delete them
			return nil, fmt.Errorf("pgtest: Patroni's network: %w", err)
		}
		return n, nil
	}
	return nil, fmt.Errorf("pgtest: Patroni's network: no free namespace name: %w", lastErr)
}

func (n *patroniNet) setup() error {
	return runAll(
		[]string{"ip", "-n", n.sw, "link", "add", "br0", "type", "bridge"},
		[]string{"ip", "-n", n.sw, "link", "set", "br0", "up"},
		[]string{"ip", "link", "add", n.rootIf, "type", "veth", "peer", "name", "r", "netns", n.sw},
		[]string{"ip", "-n", n.sw, "link", "set", "r", "master", "br0"},
		[]string{"ip", "-n", n.sw, "link", "set", "r", "up"},
		[]string{"ip", "addr", "add", n.ip(-1) + "/28", "dev", n.rootIf},
		[]string{"ip", "link", "set", n.rootIf, "up"},
		[]string{"ip", "netns", "exec", n.sw, "nft",
			"add table bridge pgtest; add chain bridge pgtest cut { type filter hook forward priority filter; policy accept; }"},
	)
}

// addNode makes node i's namespace and plugs it into the switch; it
// returns the namespace.
func (n *patroniNet) addNode(i int) (string, error) {
	ns, port := n.nodeNS(i), "n"+strconv.Itoa(i)
	return ns, runAll(
		[]string{"ip", "netns", "add", ns},
		[]string{"ip", "-n", ns, "link", "set", "lo", "up"},
		[]string{"ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", n.sw},
		[]string{"ip", "-n", n.sw, "link", "set", port, "master", "br0"},
		[]string{"ip", "-n", n.sw, "link", "set", port, "up"},
		[]string{"ip", "-n", ns, "addr", "add", n.ip(i) + "/28", "dev", "eth0"},
		[]string{"ip", "-n", ns, "link", "set", "eth0", "up"},
	)
}

// ip returns node i's address, ours for i = -1.
func (n *patroniNet) ip(i int) string {
	return fmt.Sprintf("10.252.%d.%d", n.id>>4, (n.id&15)<<4+2+i)
}

func (n *patroniNet) nodeNS(i int) string { return n.sw + "-n" + strconv.Itoa(i) }

// setCut cuts node i off (or reconnects it), in one nft transaction that
// rewrites the switch's rules from the set of nodes cut off.
func (n *patroniNet) setCut(i int, cut bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	next := slices.DeleteFunc(slices.Clone(n.cut), func(j int) bool { return j == i })
	if cut {
		next = append(next, i)
	}
	rules := []string{"flush chain bridge pgtest cut"}
	for _, j := range next {
		for _, dir := range []string{"iifname", "oifname"} {
			rules = append(rules, fmt.Sprintf("add rule bridge pgtest cut %s \"n%d\" ether type != arp drop", dir, j))
		}
	}
	if err := run("ip", "netns", "exec", n.sw, "nft", strings.Join(rules, "; ")); err != nil {
		return err
	}
	n.cut = next
	return nil
}

// close deletes our link and every namespace, which takes the switch, its
// rules and the nodes' links with them (once no process runs in a node's
// namespace: the cluster is stopped first).
func (n *patroniNet) close() {
	_ = run("ip", "link", "del", n.rootIf)
	for i := range n.nodes {
		_ = run("ip", "netns", "del", n.nodeNS(i))
	}
	_ = run("ip", "netns", "del", n.sw)
}

// runAll runs each command in turn, stopping at the first that fails.
func runAll(cmds ...[]string) error {
	for _, c := range cmds {
		if err := run(c...); err != nil {
			return err
		}
	}
	return nil
}
