package pgtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// patroniNode is one PostgreSQL node and the Patroni that runs it.
type patroniNode struct {
	name       string
	dir        string
	ns         string // its network namespace, "" on loopback
	host       string // the address its PostgreSQL and REST API listen on
	pgPort     int
	restPort   int
	cred       *syscall.Credential
	proc       *patroniProc
	configPath string
}

// patroniCred is who runs Patroni and PostgreSQL when we are root.
func patroniCred() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	return unprivilegedUser()
}

func (p *Patroni) newNode(i int, cred *syscall.Credential) (*patroniNode, error) {
	n := &patroniNode{name: "node" + strconv.Itoa(i), cred: cred, host: "127.0.0.1"}
	n.dir = filepath.Join(p.dir, n.name)
	var err error
	if p.net != nil { // a namespace of its own: the usual ports
		if n.ns, err = p.net.addNode(i); err != nil {
			return nil, fmt.Errorf("pgtest: Patroni's network: %w", err)
		}
		n.host, n.pgPort, n.restPort = p.net.ip(i), 5432, 8008
	} else {
		if n.pgPort, err = freePort(); err != nil {
			return nil, err
		}
		if n.restPort, err = freePort(); err != nil {
			return nil, err
		}
	}
	if err := os.Mkdir(n.dir, 0o700); err != nil {
		return nil, err
	}
	n.configPath = filepath.Join(p.dir, n.name+".yml")
	if err := os.WriteFile(n.configPath, []byte(p.nodeConfig(n)), 0o644); err != nil {
		return nil, err
	}
	if cred != nil {
		for _, path := range []string{p.dir, n.dir} {
			if err := os.Chown(path, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, err
			}
		}
	}
	return n, nil
}

// nodeConfig is n's Patroni configuration (YAML; JSON is YAML).
func (p *Patroni) nodeConfig(n *patroniNode) string {
	q := strconv.Quote
	rest, pg := q(n.addr(n.restPort)), q(n.addr(n.pgPort))
	clients := "127.0.0.1/32"
	if p.net != nil {
		clients = patroniNetSubnet
	}
	return fmt.Sprintf(`{"scope": "pgtest", "name": %s,
"restapi": {"listen": %s, "connect_address": %s},
"etcd3": {"hosts": [%s]},
"bootstrap": {"dcs": {"ttl": %d, "loop_wait": 1, "retry_timeout": 5, "maximum_lag_on_failover": 1048576,
  "synchronous_mode": %t, "synchronous_mode_strict": %t,
  "postgresql": {"use_pg_rewind": true, "parameters": {"wal_level": "replica", "hot_standby": "on",
    "max_wal_senders": 10, "max_replication_slots": 10, "wal_log_hints": "on", "max_connections": 100}}},
  "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
  "pg_hba": ["local all all trust", "host all all %s trust", "host replication all %s trust"]},
"postgresql": {"listen": %s, "connect_address": %s, "data_dir": %s, "bin_dir": %s,
  "pgpass": %s,
  "authentication": {"superuser": {"username": "postgres", "password": "postgres"},
    "replication": {"username": "replicator", "password": "replicator"},
    "rewind": {"username": "postgres", "password": "postgres"}},
  "parameters": {"unix_socket_directories": %s, "fsync": "off"}},
"log": {"level": "INFO"}}
`, q(n.name), rest, rest, q(p.host+":"+strconv.Itoa(p.etcd)), p.opts.TTL, !p.opts.Async, p.opts.Strict,
		clients, clients, pg, pg, q(filepath.Join(n.dir, "data")), q(p.bindir), q(filepath.Join(n.dir, "pgpass")), q(n.dir))
}

// addr returns n's address with port.
func (n *patroniNode) addr(port int) string { return n.host + ":" + strconv.Itoa(port) }

func (n *patroniNode) start(p *Patroni) error {
	return p.spawn("patroni-"+n.name, n.ns, n.cred, "patroni", n.configPath)
}

// postmasterPID reads n's postmaster.pid; 0 if there is none.
func (n *patroniNode) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(n.dir, "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	return pid
}

// stop stops n's Patroni (which stops its PostgreSQL) and then whatever
// PostgreSQL is left.
func (n *patroniNode) stop() {
	n.proc.stop(30 * time.Second)
	if pid := n.postmasterPID(); pid > 0 && syscall.Kill(pid, syscall.SIGQUIT) == nil && !waitDead(pid, 5*time.Second) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

func (p *Patroni) node(name string) (*patroniNode, error) {
	for _, n := range p.nodes {
		if n.name == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("pgtest: no Patroni node %q", name)
}

// Nodes returns the nodes' names, node0, node1, ….
func (p *Patroni) Nodes() []string {
	var out []string
	for _, n := range p.nodes {
		out = append(out, n.name)
	}
	return out
}

// DSN returns a connection string naming every node, with
// target_session_attrs=read-write: a client connects to whichever node is
// the primary, as pgx and libpq do with a multi-host DSN.
func (p *Patroni) DSN() string {
	var hosts []string
	for _, n := range p.nodes {
		hosts = append(hosts, n.addr(n.pgPort))
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/postgres?sslmode=disable&connect_timeout=5&target_session_attrs=read-write"
}

// HAProxyDSN returns a connection string through HAProxy, which routes to
// the node whose Patroni answers GET /primary with 200 and cuts the
// sessions of a node marked down.
func (p *Patroni) HAProxyDSN() string {
	return "postgres://postgres@127.0.0.1:" + strconv.Itoa(p.haport) + "/postgres?sslmode=disable&connect_timeout=5"
}

// NodeDSN returns a connection string for one node alone.
func (p *Patroni) NodeDSN(name string) (string, error) {
	n, err := p.node(name)
	if err != nil {
		return "", err
	}
	return "postgres://postgres@" + n.addr(n.pgPort) + "/postgres?sslmode=disable&connect_timeout=5", nil
}

// view returns patronictl list and the tails of every log, for errors.
func (p *Patroni) view() string {
	var b strings.Builder
	if len(p.nodes) > 0 {
		out, err := exec.Command("patronictl", "-c", p.nodes[0].configPath, "list").CombinedOutput()
		fmt.Fprintf(&b, "patronictl list (%v):\n%s\n", err, out)
	}
	for _, n := range p.nodes {
		if n.proc != nil {
			fmt.Fprintf(&b, "--- %s:\n%s\n", n.proc.name, tail(n.proc.log))
		}
	}
	for _, pr := range p.procs {
		fmt.Fprintf(&b, "--- %s:\n%s\n", pr.name, tail(pr.log))
	}
	return b.String()
}

// startHAProxy starts HAProxy in front of the nodes, checking each
// node's Patroni REST API every 250 ms.
func (p *Patroni) startHAProxy() error {
	var err error
	if p.haport, err = freePort(); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, `global
	maxconn 200
defaults
	mode tcp
	timeout connect 4s
	timeout client 30m
	timeout server 30m
	timeout check 2s
listen primary
	bind 127.0.0.1:%d
	option httpchk GET /primary
	http-check expect status 200
	default-server inter 250ms fall 2 rise 1 on-marked-down shutdown-sessions
`, p.haport)
	for _, n := range p.nodes {
		fmt.Fprintf(&b, "\tserver %s %s maxconn 100 check port %d\n", n.name, n.addr(n.pgPort), n.restPort)
	}
	cfg := filepath.Join(p.dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o644); err != nil {
		return err
	}
	return p.spawn("haproxy", "", nil, "haproxy", "-db", "-f", cfg)
}
