package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNoPgpool is returned by [StartPgpool] when no pgpool binary is found
// (PGTEST_PGPOOL, PATH, /usr/sbin/pgpool).
var ErrNoPgpool = errors.New("pgtest: no pgpool binary (install Debian's pgpool2 package, or set PGTEST_PGPOOL)")

// Pgpool is a real Pgpool-II that pgtest started in front of a [Server],
// in raw mode with the server as its one backend. Pgpool-II pools in
// session mode only: a client keeps one backend session for as long as it
// is connected, and the session is reset (DISCARD ALL) and cached for the
// next client when it leaves. It listens on a free loopback port and keeps
// its files in a temp dir, both removed by [Pgpool.Close]; should this
// process die first, a watchdog kills it.
type Pgpool struct {
	dir    string
	port   int
	cache  bool
	reaper *reaper
	cmd    *exec.Cmd
	done   chan struct{}

	closeOnce sync.Once
	closeErr  error
}

// StartPgpool starts pgpool in front of s, which must be reached over TCP,
// and returns once a query through it succeeds. With cache, it keeps a
// client's backend session for the next client (connection_cache = on);
// without, each client gets a new one. ctx bounds only the start.
func StartPgpool(ctx context.Context, s *Server, cache bool) (*Pgpool, error) {
	bin, err := pgpoolBinary()
	if err != nil {
		return nil, err
	}
	target, err := pgconn.ParseConfig(s.adminDSN)
	if err != nil {
		return nil, err
	}
	if strings.HasPrefix(target.Host, "/") {
		return nil, errNoTCP
	}
	p := &Pgpool{cache: cache}
	if p.dir, err = os.MkdirTemp("", "pgtest-pgpool-"); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = p.Close()
		}
	}()
	for attempt := 0; ; attempt++ { // a free port can be taken before pgpool binds it
		if err = p.writeConfig(s, target); err != nil {
			return nil, err
		}
		if err = p.start(ctx, bin, s.adminDSN); err == nil || attempt == 4 || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	ok = true
	return p, nil
}

// pgpoolBinary finds pgpool: PGTEST_PGPOOL, PATH, /usr/sbin.
func pgpoolBinary() (string, error) {
	return findBinary("PGTEST_PGPOOL", "pgpool", "/usr/sbin/pgpool", ErrNoPgpool)
}

// writeConfig writes pgpool.conf and the empty pcp.conf and pool_hba.conf
// it insists on. Clients are passed through to the server, which decides
// who may log in.
func (p *Pgpool) writeConfig(s *Server, target *pgconn.Config) error {
	var err error
	if p.port, err = pickPort(s); err != nil {
		return err
	}
	pcpPort, err := freePort()
	if err != nil {
		return err
	}
	cache := "off"
	if p.cache {
		cache = "on"
	}
	q := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	conf := strings.Join([]string{
		"backend_clustering_mode = 'raw'",
		"listen_addresses = '127.0.0.1'",
		"port = " + strconv.Itoa(p.port),
		"unix_socket_directories = " + q(p.dir),
		"pcp_listen_addresses = ''",
		"pcp_port = " + strconv.Itoa(pcpPort),
		"pcp_socket_dir = " + q(p.dir),
		"backend_hostname0 = " + q(target.Host),
		"backend_port0 = " + strconv.Itoa(int(target.Port)),
		"backend_weight0 = 1",
		"backend_flag0 = 'DISALLOW_TO_FAILOVER'",
		"num_init_children = 32",
		"max_pool = 4",
		"connection_cache = " + cache,
		"load_balance_mode = off",
		"enable_pool_hba = off",
		"pid_file_name = " + q(filepath.Join(p.dir, "pgpool.pid")),
		"logdir = " + q(p.dir),
		"health_check_period = 0",
		"sr_check_period = 0",
		"failover_on_backend_error = off",
		"",
	}, "\n")
	for name, body := range map[string]string{"pgpool.conf": conf, "pcp.conf": "", "pool_hba.conf": ""} {
		if err := os.WriteFile(filepath.Join(p.dir, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// start runs pgpool in a process group of its own (it forks a child per
// client slot) and waits until a query through it succeeds.
func (p *Pgpool) start(ctx context.Context, bin, adminDSN string) error {
	cmd := exec.Command(bin, "-n", "-f", filepath.Join(p.dir, "pgpool.conf"),
		"-F", filepath.Join(p.dir, "pcp.conf"), "-a", filepath.Join(p.dir, "pool_hba.conf"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Dir = p.dir
	logf, err := os.Create(filepath.Join(p.dir, "pgpool.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgpool: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.cmd, p.done = cmd, done
	if p.reaper, err = startWatchdog(groupReaperScript, "PGTEST_REAP_DIR="+p.dir, "PGTEST_REAP_PID="+strconv.Itoa(cmd.Process.Pid)); err != nil {
		p.stop()
		return err
	}
	dsn, err := p.DSN(adminDSN)
	if err != nil {
		return err
	}
	return waitPooler(ctx, "pgpool", dsn, filepath.Join(p.dir, "pgpool.log"), done, p.stop, p.ours(dsn))
}

// ours tells whether the Pgpool-II that answers at p's port is p's own: it
// names p's dir as its logdir.
func (p *Pgpool) ours(dsn string) func(context.Context) error {
	return func(ctx context.Context) error {
		rows, err := askPooler(ctx, dsn, "", "pgpool show logdir")
		if err != nil {
			return err
		}
		if len(rows) == 1 && len(rows[0]) == 1 && rows[0][0] == p.dir {
			return nil
		}
		return fmt.Errorf("%w: the Pgpool-II there has logdir %v", errNotOurs, rows)
	}
}

// stop ends pgpool's whole process group at once and dismisses its
// watchdog.
func (p *Pgpool) stop() {
	if p.cmd != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGINT) // fast shutdown
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		p.cmd = nil
	}
	if p.reaper != nil {
		p.reaper.dismiss()
		p.reaper = nil
	}
}

// Addr returns the address pgpool listens on, host:port.
func (p *Pgpool) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// DSN returns dsn, a connection string for pgpool's server, changed to
// connect through pgpool.
func (p *Pgpool) DSN(dsn string) (string, error) { return viaAddr(dsn, p.Addr()) }

// Close stops pgpool, which closes its connections to the server, and
// removes its files. It is idempotent.
func (p *Pgpool) Close() error {
	p.closeOnce.Do(func() {
		p.stop()
		if p.dir != "" {
			p.closeErr = os.RemoveAll(p.dir)
		}
	})
	return p.closeErr
}

// groupReaperScript stops a pgpool process group and removes its dir
// should this process die without closing it (see reaperScript): SIGINT
// first, so that pgpool removes its SysV shared memory (a SIGKILL leaves
// some 130 MB of it behind), then SIGKILL for what is left after 10 s.
// (dash's kill takes no "--": the group is the negative pid alone.)
const groupReaperScript = `
read -r line
[ "$line" = done ] && exit 0
pid=$PGTEST_REAP_PID
if kill -INT -"$pid" 2>/dev/null; then
	i=0
	while kill -0 -"$pid" 2>/dev/null && [ $i -lt 100 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	kill -KILL -"$pid" 2>/dev/null
fi
rm -rf "$PGTEST_REAP_DIR"
exit 0
`
