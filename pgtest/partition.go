package pgtest

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
)

// partitionSubnet is where links live: each takes a /30, the root side .1
// and the namespace side .2. A throwaway local server accepts connections
// from it (pg_hba.conf) besides loopback.
const partitionSubnet = "10.251.0.0/16"

// netLink is a private network namespace joined to ours by a veth pair. A
// proxy's upstream sockets are created inside it, so the server's peer sits
// behind a real network interface whose packets can be dropped.
type netLink struct {
	ns           string // network namespace name, under /run/netns
	rootIf, nsIf string // veth ends
	rootIP, nsIP string
	reaper       *reaper
	tool         string // "nft" or "iptables": see setupDrops
}

// linksUsable reports whether partition links can be made here, as far as
// can be told without making one: on Linux, as root (the namespace and
// veth steps need CAP_NET_ADMIN, which root has). A listener that serves
// partition links — a [Bouncer] — listens beyond loopback only then.
func linksUsable() bool { return runtime.GOOS == "linux" && os.Geteuid() == 0 }

// errNoPartition wraps every reason a partitionable proxy cannot be made.
var errNoPartition = fmt.Errorf("pgtest: kernel-level partition unavailable (needs root or CAP_NET_ADMIN, ip and nft or iptables, and a local-mode server): %w", ErrUnsupported)

// newNetLink creates a namespace and veth pair with permanent neighbour
// entries (no ARP to fail during a partition).
func newNetLink() (*netLink, error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("%w: network namespaces are Linux's", errNoPartition)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("%w: %v", errNoPartition, err)
	}
	var lastErr error
	for range 5 {
		b := make([]byte, 2)
		_, _ = rand.Read(b)
		b[1] &^= 3 // a /30: .0 network, .1 root, .2 namespace
		id := fmt.Sprintf("%02x%02x", b[0], b[1])
		l := &netLink{
			ns:     "pgtest-" + id,
			rootIf: "pgt" + id + "r",
			nsIf:   "pgt" + id + "n",
			rootIP: fmt.Sprintf("10.251.%d.%d", b[0], b[1]+1),
			nsIP:   fmt.Sprintf("10.251.%d.%d", b[0], b[1]+2),
		}
		if err := run("ip", "netns", "add", l.ns); err != nil {
			lastErr = err // taken by another test process, or not permitted
			continue
		}
		var err error
		if l.reaper, err = startReaper("", "", l.ns); err != nil {
			_ = run("ip", "netns", "del", l.ns)
			return nil, err
		}
		if err := l.setup(); err != nil {
			l.close()
			return nil, fmt.Errorf("%w: %v", errNoPartition, err)
		}
		return l, nil
	}
	return nil, fmt.Errorf("%w: %v", errNoPartition, lastErr)
}

func (l *netLink) setup() error {
	steps := [][]string{
		{"ip", "link", "add", l.rootIf, "type", "veth", "peer", "name", l.nsIf},
		{"ip", "link", "set", l.nsIf, "netns", l.ns},
		{"ip", "addr", "add", l.rootIP + "/30", "dev", l.rootIf},
		{"ip", "link", "set", l.rootIf, "up"},
		{"ip", "-n", l.ns, "addr", "add", l.nsIP + "/30", "dev", l.nsIf},
		{"ip", "-n", l.ns, "link", "set", l.nsIf, "up"},
		{"ip", "-n", l.ns, "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			return err
		}
	}
	rootMAC, err := os.ReadFile("/sys/class/net/" + l.rootIf + "/address")
	if err != nil {
		return err
	}
	nsMAC, err := output("ip", "-n", l.ns, "-o", "link", "show", l.nsIf)
	if err != nil {
		return err
	}
	mac := fieldAfter(nsMAC, "link/ether")
	if mac == "" {
		return fmt.Errorf("no MAC address for %s in %q", l.nsIf, nsMAC)
	}
	if err := run("ip", "neigh", "replace", l.nsIP, "lladdr", mac, "dev", l.rootIf, "nud", "permanent"); err != nil {
		return err
	}
	if err := run("ip", "-n", l.ns, "neigh", "replace", l.rootIP, "lladdr",
		strings.TrimSpace(string(rootMAC)), "dev", l.nsIf, "nud", "permanent"); err != nil {
		return err
	}
	return l.setupDrops()
}

// close deletes the namespace, which destroys the veth pair with it.
func (l *netLink) close() {
	_ = run("ip", "netns", "del", l.ns)
	_ = run("ip", "link", "del", l.rootIf) // gone already, unless the move failed
	l.reaper.dismiss()
}

func run(args ...string) error {
	_, err := output(args...)
	return err
}

func output(args ...string) (string, error) {
	var out bytes.Buffer
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// fieldAfter returns the whitespace-separated field after key in s.
func fieldAfter(s, key string) string {
	f := strings.Fields(s)
	for i := range len(f) - 1 {
		if f[i] == key {
			return f[i+1]
		}
	}
	return ""
}
