package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNoPatroni is returned by [StartPatroni] when patroni, patronictl, etcd
// or haproxy is not installed (Debian's patroni, etcd-server and haproxy
// packages), or no PostgreSQL binaries are in /usr/lib/postgresql/*/bin.
var ErrNoPatroni = errors.New("pgtest: Patroni needs patroni, patronictl, etcd and haproxy (Debian's patroni, etcd-server and haproxy packages) and PostgreSQL in /usr/lib/postgresql/*/bin")

// PatroniOptions say how to build a [Patroni] cluster. The zero value gives
// two nodes in synchronous mode (not strict).
type PatroniOptions struct {
	// Nodes is the number of PostgreSQL nodes, 2 if 0, at most 13.
	Nodes int
	// Async turns synchronous_mode off: a failover may then lose commits
	// the old primary acknowledged.
	Async bool
	// Strict turns synchronous_mode_strict on: with no synchronous standby
	// left, the primary accepts no writes.
	Strict bool
	// TTL is the leader key's time to live in etcd, in seconds (Patroni's
	// minimum, 20, if 0): a primary that dies is replaced about this long
	// after its last renewal.
	TTL int
}

// Patroni is a real Patroni cluster on this machine, for tests: one etcd
// member, Nodes PostgreSQL servers each run by its own Patroni, and an
// HAProxy that routes to whichever node Patroni's REST API calls the
// primary (GET /primary). Where it can (Linux, as root, with ip and nft)
// each node — its Patroni and its PostgreSQL — lives in a network
// namespace of its own on a private switch, so that [Patroni.Partition]
// can cut it off for real; elsewhere the nodes are local processes on
// loopback ports. Clients reach the primary through [Patroni.DSN] (every
// node, target_session_attrs = read-write) or [Patroni.HAProxyDSN].
// Everything lives in one temp dir (and those namespaces); [Patroni.Close]
// stops it all, and a watchdog does should this process die first.
type Patroni struct {
	opts   PatroniOptions
	dir    string
	bindir string
	net    *patroniNet // nil: the nodes are on loopback
	netErr error       // why they are, if namespaces were tried
	host   string      // our address: etcd's and HAProxy's
	etcd   int         // etcd's client port
	haport int
	nodes  []*patroniNode
	procs  []*patroniProc // etcd, haproxy
	reaper *reaper

	closeOnce sync.Once
	closeErr  error
}

// patroniProc is one process group the cluster started.
type patroniProc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// StartPatroni starts a cluster and returns once a primary accepts writes
// through the multi-host DSN and, in synchronous mode, Patroni names a
// synchronous standby (see [Patroni.WaitSynchronous]). ctx bounds only the start; on failure the error
// carries etcd's view of the cluster and every process's log tail.
func StartPatroni(ctx context.Context, o PatroniOptions) (*Patroni, error) {
	if o.Nodes <= 0 {
		o.Nodes = 2
	}
	if o.Nodes > maxPatroniNodes {
		return nil, fmt.Errorf("pgtest: StartPatroni: %d nodes; at most %d (a cluster's network is a /28)", o.Nodes, maxPatroniNodes)
	}
	if o.TTL <= 0 {
		o.TTL = 20
	}
	p := &Patroni{opts: o}
	if err := p.findBinaries(); err != nil {
		return nil, err
	}
	var err error
	if p.dir, err = os.MkdirTemp("", "pgtest-patroni-"); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = p.Close()
		}
	}()
	if p.reaper, err = startWatchdog(patroniReaperScript, "PGTEST_REAP_DIR="+p.dir); err != nil {
		return nil, err
	}
	p.host = "127.0.0.1"
	if !patroniNetUsable() {
		p.netErr = errors.New("not root on Linux, or no ip or nft")
	} else if p.net, p.netErr = newPatroniNet(p.dir, o.Nodes); p.netErr == nil {
		p.host = p.net.ip(-1)
	}
	if err := p.startAll(ctx); err != nil {
		return nil, err
	}
	if _, err := p.WaitSynchronous(ctx); err != nil {
		return nil, err
	}
	ok = true
	return p, nil
}

func (p *Patroni) findBinaries() error {
	for _, b := range []string{"patroni", "patronictl", "etcd", "haproxy"} {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Errorf("%w (%s: %v)", ErrNoPatroni, b, err)
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for _, d := range dirs {
		if isExecutable(filepath.Join(d, "pg_ctl")) && isExecutable(filepath.Join(d, "pg_rewind")) {
			p.bindir = d
		}
	}
	if p.bindir == "" {
		return ErrNoPatroni
	}
	return nil
}

// startAll starts etcd, the nodes and HAProxy.
func (p *Patroni) startAll(ctx context.Context) error {
	var err error
	if p.etcd, err = freePort(); err != nil {
		return err
	}
	peer, err := freePort()
	if err != nil {
		return err
	}
	etcdURL := "http://" + p.host + ":" + strconv.Itoa(p.etcd)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peer)
	if err := p.spawn("etcd", "", nil, "etcd", "--name", "e0", "--data-dir", filepath.Join(p.dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "e0="+peerURL, "--enable-v2=true"); err != nil {
		return err
	}
	if err := waitHTTP(ctx, etcdURL+"/health", p.procs[0]); err != nil {
		return err
	}
	cred, err := patroniCred()
	if err != nil {
		return err
	}
	for i := range p.opts.Nodes {
		n, err := p.newNode(i, cred)
		if err != nil {
			return err
		}
		p.nodes = append(p.nodes, n)
		if err := n.start(p); err != nil {
			return err
		}
	}
	return p.startHAProxy()
}

// spawn starts a process group of its own, in the network namespace ns
// unless ns is "", logging to dir/name.log, with its pid in dir/name.pgid
// for the watchdog.
func (p *Patroni) spawn(name, ns string, cred *syscall.Credential, bin string, args ...string) error {
	logPath := filepath.Join(p.dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Dir = p.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	start := cmd.Start
	if ns != "" {
		start = func() error { return inNetns(ns, cmd.Start) }
	}
	if err := start(); err != nil {
		return fmt.Errorf("pgtest: %s: %w", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	pr := &patroniProc{name: name, cmd: cmd, done: done, log: logPath}
	if strings.HasPrefix(name, "patroni-") {
		for _, n := range p.nodes {
			if "patroni-"+n.name == name {
				n.proc = pr
			}
		}
	} else {
		p.procs = append(p.procs, pr)
	}
	return os.WriteFile(filepath.Join(p.dir, name+".pgid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
}

// stop ends a process group: SIGTERM, then SIGKILL after wait.
func (pr *patroniProc) stop(wait time.Duration) {
	if pr == nil || pr.cmd == nil {
		return
	}
	_ = syscall.Kill(-pr.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-pr.done:
	case <-time.After(wait):
	}
	_ = syscall.Kill(-pr.cmd.Process.Pid, syscall.SIGKILL)
	<-pr.done
}

// waitHTTP waits until url answers 200, or pr exits, or ctx ends.
func waitHTTP(ctx context.Context, url string, pr *patroniProc) error {
	for {
		if code, _ := httpGet(ctx, url); code == http.StatusOK {
			return nil
		}
		select {
		case <-pr.done:
			return fmt.Errorf("pgtest: %s exited at start: %s", pr.name, tail(pr.log))
		case <-ctx.Done():
			return fmt.Errorf("pgtest: %s not ready: %w: %s", pr.name, context.Cause(ctx), tail(pr.log))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// httpGet returns the status and body of a GET of url (2 s at most).
func httpGet(ctx context.Context, url string) (int, string) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	n, _ := resp.Body.Read(buf)
	b.Write(buf[:n])
	return resp.StatusCode, b.String()
}

// Close stops HAProxy, every node (Patroni and its PostgreSQL) and etcd,
// and removes the temp dir. It is idempotent.
func (p *Patroni) Close() error {
	p.closeOnce.Do(func() {
		for i := len(p.procs) - 1; i >= 1; i-- { // HAProxy first, etcd last
			p.procs[i].stop(5 * time.Second)
		}
		for _, n := range p.nodes {
			n.stop()
		}
		if len(p.procs) > 0 {
			p.procs[0].stop(5 * time.Second)
		}
		if p.net != nil {
			p.net.close()
		}
		if p.reaper != nil {
			p.reaper.dismiss()
		}
		if p.dir != "" {
			p.closeErr = os.RemoveAll(p.dir)
		}
	})
	return p.closeErr
}

// patroniReaperScript stops everything a Patroni cluster started should
// this process die without closing it (see reaperScript): every process
// group whose pid is in a .pgid file, then every postmaster (Patroni starts
// PostgreSQL in a session of its own) by an immediate shutdown, then the
// link and namespaces listed in dir/netns (the switch's with its rules),
// then the dir.
const patroniReaperScript = `
read -r line
[ "$line" = done ] && exit 0
dir=$PGTEST_REAP_DIR
for f in "$dir"/*.pgid; do
	[ -e "$f" ] || continue
	kill -KILL -"$(cat "$f")" 2>/dev/null
done
for f in "$dir"/*/data/postmaster.pid; do
	[ -e "$f" ] || continue
	kill -QUIT "$(head -n 1 "$f")" 2>/dev/null
done
sleep 1
for f in "$dir"/*/data/postmaster.pid; do
	[ -e "$f" ] || continue
	kill -KILL "$(head -n 1 "$f")" 2>/dev/null
done
if [ -f "$dir/netns" ]; then
	while read -r kind name; do
		case $kind in
		link) ip link del "$name" 2>/dev/null ;;
		netns) ip netns del "$name" 2>/dev/null ;;
		esac
	done <"$dir/netns"
fi
rm -rf "$dir"
exit 0
`
