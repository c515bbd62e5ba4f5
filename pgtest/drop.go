package pgtest

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// A link's packet drops are firewall rules inside its namespace, on its
// veth end: packets from the server are dropped on arrival (the input
// hook), packets to the server as they leave (the output hook). Nothing is
// ever dropped in our own namespace, where the server's socket lives: a
// packet the server's kernel drops itself (a qdisc, an output rule) counts
// as local congestion, which keepalives and tcp_user_timeout never give up
// on; a packet lost beyond its interface is a peer that stopped answering.

// nftTable holds a link's drop rules when nftables is available.
const nftTable = `table inet pgtest {
	chain in { type filter hook input priority filter; policy accept; }
	chain out { type filter hook output priority filter; policy accept; }
}
`

// errNoFirewall: neither nft nor iptables works in the namespace.
var errNoFirewall = errors.New("neither nft nor iptables-restore can set rules in a network namespace")

// setupDrops picks the firewall tool, nftables first, and leaves the
// namespace with no drops.
func (l *netLink) setupDrops() error {
	var errs []error
	if _, err := exec.LookPath("nft"); err == nil {
		if err = l.inNS(nftTable, "nft", "-f", "-"); err == nil {
			l.tool = "nft"
			return nil
		}
		errs = append(errs, err)
	}
	if _, err := exec.LookPath("iptables-restore"); err == nil {
		l.tool = "iptables"
		if err = l.drop(false, false); err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("%w: %v", errNoFirewall, errors.Join(errs...))
}

// drop replaces the link's rules so that exactly the directions asked for
// are dropped: toServer the packets the proxy sends the server, toClient
// those the server sends the proxy. drop(false, false) heals. Each tool
// swaps its rules in one transaction.
func (l *netLink) drop(toServer, toClient bool) error {
	var b strings.Builder
	switch l.tool {
	case "nft":
		b.WriteString("flush chain inet pgtest in\nflush chain inet pgtest out\n")
		if toClient {
			fmt.Fprintf(&b, "add rule inet pgtest in iifname %q drop\n", l.nsIf)
		}
		if toServer {
			fmt.Fprintf(&b, "add rule inet pgtest out oifname %q drop\n", l.nsIf)
		}
		return l.inNS(b.String(), "nft", "-f", "-")
	case "iptables":
		b.WriteString("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n")
		if toClient {
			fmt.Fprintf(&b, "-A INPUT -i %s -j DROP\n", l.nsIf)
		}
		if toServer {
			fmt.Fprintf(&b, "-A OUTPUT -o %s -j DROP\n", l.nsIf)
		}
		b.WriteString("COMMIT\n")
		return l.inNS(b.String(), "iptables-restore", "-w")
	}
	return errNoFirewall
}

// inNS runs a command inside the link's namespace with stdin as its input.
func (l *netLink) inNS(stdin string, args ...string) error {
	var out bytes.Buffer
	cmd := exec.Command("ip", append([]string{"netns", "exec", l.ns}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s in %s: %w: %s", strings.Join(args, " "), l.ns, err, strings.TrimSpace(out.String()))
	}
	return nil
}
